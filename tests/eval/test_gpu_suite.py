"""`eval/gpu_suite.sh` end to end on the CPU (`--device cpu --quick`, the smoke settings), so the GPU suite cannot rot
while no GPU is at hand; and every benchmark's `--device` check: a device this machine lacks is one usage line (exit
2) before any model loads, and the suite then writes nothing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = ("bench_text", "bench_image", "bench_continuous", "bench_video", "bench_graphs", "quality", "cost_model",
              "real_size")


def suite(*args: str, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}  # the worker's share of the cores
    return subprocess.run(["bash", str(REPO / "eval" / "gpu_suite.sh"), *args, "--out", str(out), "--python",
                           sys.executable], capture_output=True, text=True, cwd=REPO, env=env, timeout=900, check=False)


@pytest.mark.slow  # every benchmark's smoke run again, in one process: minutes
def test_the_suite_runs_every_benchmark_on_the_cpu(tmp_path, record_property):
    """In two --only calls, as on a GPU lent for 10-minute commands: the second call's environment.json keeps the
    first call's runs."""
    for half in (BENCHMARKS[:3], BENCHMARKS[3:]):
        run = suite("--device", "cpu", "--quick", "--only", ",".join(half), out=tmp_path / "results")
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    written = sorted(p.name for p in (tmp_path / "results").iterdir())
    assert written == sorted([f"{name}.json" for name in BENCHMARKS] + ["environment.json"])
    environment = json.loads((tmp_path / "results" / "environment.json").read_text())
    assert environment["device"]["type"] == "cpu" and environment["environment"]["torch"] == torch.__version__
    assert environment["tier"] == "smoke"
    assert [r["benchmark"] for r in environment["runs"]] == list(BENCHMARKS)
    for r in environment["runs"]:  # the exact commands, naming the results where they now are
        assert f"-m mmspec.eval.{r['benchmark']} --device cpu" in r["command"]
        assert f"--json {tmp_path / 'results' / r['benchmark']}.json" in r["command"]
    for name in BENCHMARKS:
        report = json.loads((tmp_path / "results" / f"{name}.json").read_text())
        if name != "quality":
            assert report["device"]["type"] == "cpu", name
    cost = json.loads((tmp_path / "results" / "cost_model.json").read_text())
    assert cost["projection_relative_error"] >= 0
    assert set(cost["models"]["llamagen-b"]["projected"]["1"]) == {"ar", "sjd", "mc_sjd", "lantern", "draft", "heads"}
    graphs = json.loads((tmp_path / "results" / "bench_graphs.json").read_text())
    assert graphs["graphs"] == "needs CUDA" and set(graphs["modes"]) == {"eager"}
    image = graphs["modes"]["eager"]["1"]
    assert 0 <= image["mc_sjd"]["outside_share"] < 1
    for method, figures in image.items():  # the host reads the progress once per block of iterations
        assert graphs["methods"][method]["fullgraph"], (method, graphs["methods"][method])
        assert figures["host_reads_per_iteration"] <= 0.25, (method, figures)
        assert figures["wasted_iterations_share"] <= 0.05, (method, figures)
    families = {m: r for m, r in graphs["loops"]["eager"].items() if m.split("_")[0] in ("janus", "emu3", "lumina")}
    assert len(families) == 12 and all(r["fullgraph"] for r in families.values()), families  # on their slot cache
    assert all(r["host_reads_per_iteration"] <= 0.25 for r in families.values()), families
    record_property("measured", f"gpu_suite.sh --device cpu --quick: {environment['total_seconds']} s")


def test_the_suite_refuses_bad_arguments_and_writes_nothing(tmp_path):
    run = suite("--frobnicate", out=tmp_path / "results")
    assert run.returncode == 2 and "unknown argument --frobnicate" in run.stderr
    run = suite("--only", "bench_text,bench_imgae", out=tmp_path / "results")
    assert run.returncode == 2
    assert run.stderr.strip() == ("gpu_suite.sh: --only: unknown benchmark 'bench_imgae'; choose from cuda_tests "
                                  "bench_text bench_image bench_continuous bench_video bench_graphs quality cost_model "
                                  "real_size")
    assert not (tmp_path / "results").exists()


@pytest.mark.slow  # a new pytest process over the whole suite's collection
def test_the_cuda_tests_run_as_one_step_and_report_their_counts(tmp_path):
    """`--only cuda_tests` on the CPU: the tests named for CUDA run (their CUDA twins skip) and their counts land in
    cuda_tests.json, the command in environment.json."""
    run = suite("--device", "cpu", "--quick", "--only", "cuda_tests", out=tmp_path / "results")
    assert run.returncode == 0, run.stderr[-2000:]
    counts = json.loads((tmp_path / "results" / "cuda_tests.json").read_text())
    assert counts["tests"] >= 20 and counts["failures"] == counts["errors"] == 0 and counts["skipped"] > 0
    assert counts["passed"] + counts["skipped"] == counts["tests"] and counts["device"]["type"] == "cpu"
    environment = json.loads((tmp_path / "results" / "environment.json").read_text())
    assert [r["benchmark"] for r in environment["runs"]] == ["cuda_tests"]
    assert "-m pytest" in environment["runs"][0]["command"] and "-k cuda" in environment["runs"][0]["command"]
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["cuda_tests.json", "environment.json"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_suite_on_a_missing_gpu_fails_at_once_and_writes_nothing(tmp_path):
    run = suite("--device", "cuda", out=tmp_path / "results")
    assert run.returncode == 2
    assert "--device cuda: no CUDA device here" in run.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.slow  # a new process per benchmark: the slow tier (the suite's own check stays)
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_refuses_a_device_this_machine_lacks(name, tmp_path):
    run = subprocess.run([sys.executable, "-m", f"mmspec.eval.{name}", "--device", "cuda", "--json",
                          str(tmp_path / "out.json")], capture_output=True, text=True, timeout=120,
                         check=False)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1].endswith("--device cuda: no CUDA device here (torch "
                                                       f"{torch.__version__}, CUDA not built in)")
    assert not (tmp_path / "out.json").exists()


@pytest.mark.slow  # new processes: the slow tier
@pytest.mark.parametrize("device", ["tpu", "cuda:x"])
def test_a_device_that_is_not_cpu_or_cuda_is_refused(device):
    run = subprocess.run([sys.executable, "-m", "mmspec.eval.cost_model", "--device", device], capture_output=True,
                         text=True, timeout=120, check=False)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1].endswith(f"--device must be auto, cpu, cuda or cuda:N, got {device!r}")
