"""Offline generation from a prompt file: one image and one stats file per prompt and seed, resumable, nothing
written twice or in part; the plain loop in-process, and a run killed half way and restarted (the slow tier)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mmspec.serving import offline
from mmspec.serving.requests import GenerationRequest
from tests.models.llamagen_tiny import tiny_pipeline

SJD = {"name": "sjd", "window": 3}


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("tiny_image")
    tiny_pipeline().save_pretrained(folder)
    return str(folder)


def test_a_resumed_run_does_what_is_not_done_and_an_image_depends_on_its_seed_only(tmp_path):
    pipe = tiny_pipeline()
    prompts = ["a red circle", "the blue square", "green", "a left circle", "red"]
    work = offline.jobs(prompts, n=2, seed=10)
    assert [job.seed for job in work] == list(range(10, 20)) and work[3].name == "000001-1"
    request = GenerationRequest("image", (), 1, 0, SJD)
    writer = offline.Writer(pipe, request, str(tmp_path))
    offline.run_locally(writer, work[:4], batch_size=3, progress=lambda k: None)
    (tmp_path / f"{work[4].name}.png").write_bytes(b"half an image")  # killed between an image and its stats
    todo = offline.pending(tmp_path, work)
    assert todo == work[4:]
    offline.run_locally(writer, todo, batch_size=4, progress=lambda k: None)
    offline.gather_stats(tmp_path, work)
    lines = [json.loads(line) for line in (tmp_path / offline.STATS_FILE).read_text().splitlines()]
    assert [line["name"] for line in lines] == [job.name for job in work]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{job.name}.{ext}" for job in work for ext in ("png", "json")] + [offline.STATS_FILE])
    for job in (work[1], work[4], work[9]):  # calls of 3 and 4 rows: each image is its direct call's
        direct = pipe(job.prompt, generator=[torch.Generator().manual_seed(job.seed)], decoding=SJD, output_type="np")
        written = np.asarray(Image.open(tmp_path / f"{job.name}.png"), dtype=np.float64) / 255
        assert np.abs(written - direct.images[0]).max() < 1 / 255


def test_a_restart_with_other_settings_is_refused(tmp_path):
    request = GenerationRequest("image", (), 1, 0, SJD, {}, {"temperature": 1.0})
    offline.start_run(tmp_path, offline.run_record("m", ["a"], 1, 0, request))
    offline.start_run(tmp_path, offline.run_record("m", ["a"], 1, 0, request))  # the same run: resumed
    with pytest.raises(ValueError, match="a run with other prompts_sha256, seed"):
        offline.start_run(tmp_path, offline.run_record("m", ["b"], 1, 5, request))


def generate(prompt_file: Path, out_dir: Path, model: str, *extra: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "mmspec.cli", "generate", "--prompts", str(prompt_file), "--out-dir",
               str(out_dir), "--model", model, "--decoding", "sjd", "--window", "3", "--batch-size", "2", *extra]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def settled(folder: Path, quiet_s: float = 2.0, limit_s: float = 60.0) -> None:
    """Wait until no file in `folder` has changed for `quiet_s` (the killed run's Ray workers have died)."""
    def snapshot() -> list:
        found = []
        for path in folder.iterdir():
            try:
                found.append((path.name, path.stat().st_mtime_ns))
            except FileNotFoundError:  # renamed meanwhile
                continue
        return sorted(found)

    last, since, deadline = snapshot(), time.monotonic(), time.monotonic() + limit_s
    while time.monotonic() - since < quiet_s and time.monotonic() < deadline:
        time.sleep(0.2)
        now = snapshot()
        if now != last:
            last, since = now, time.monotonic()


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_run_killed_half_way_and_restarted_writes_each_image_once_whole(tmp_path, tiny_model_dir, workers):
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("\n".join(f"a red circle {i}" for i in range(32)) + "\n")
    out_dir = tmp_path / "out"
    extra = ("--workers", str(workers)) if workers > 1 else ()
    run = generate(prompt_file, out_dir, tiny_model_dir, *extra)
    deadline = time.monotonic() + 240
    while len(list(out_dir.glob("0*.json"))) < 16 and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(run.pid, signal.SIGKILL)  # mid-write; Ray's workers are not in the group and die moments later
    run.wait()
    settled(out_dir)
    done_before = len(list(out_dir.glob("0*.json")))  # the images' stats files, not run.json
    assert 0 < done_before < 32, "killed half way"
    (out_dir / ".000031-0.png.12345.partial.png").write_bytes(b"half an image")  # a write the kill cut short
    restarted = generate(prompt_file, out_dir, tiny_model_dir, *extra)
    _, stderr = restarted.communicate(timeout=300)
    assert restarted.returncode == 0, stderr[-2000:]
    assert f"{done_before} of 32 images already" in stderr
    names = sorted(p.name for p in out_dir.iterdir())
    assert names == sorted([f"{i:06d}-0.{ext}" for i in range(32) for ext in ("png", "json")]
                           + [offline.RUN_FILE, offline.STATS_FILE])  # no partial file left, none twice
    for i in range(32):
        Image.open(out_dir / f"{i:06d}-0.png").verify()  # whole
    lines = (out_dir / offline.STATS_FILE).read_text().splitlines()
    assert [json.loads(line)["seed"] for line in lines] == list(range(32))
