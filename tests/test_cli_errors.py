"""The README's table of bad command-line input, run row by row as users type it (a subprocess in an empty folder):
exit status 2, exactly the table's one line on stderr, nothing on stdout, no file written — and torch, so any model,
never imported (the interpreter is started with torch blocked: importing it would fail with a traceback). Then the
errors only a loaded model can find, and the speed of `--help`."""

import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mmspec.cli import UsageError, check_port_free, main

ROOT = Path(__file__).resolve().parents[1]
LONG = "a" * 5000
# the interpreter of a row: torch blocked, and the optional extras a row's condition removes
PRELUDE = """import importlib.util, sys
sys.modules["torch"] = None
hidden = {hidden!r}
found = importlib.util.find_spec
importlib.util.find_spec = lambda name, *args: None if name.split(".")[0] in hidden else found(name, *args)
from mmspec.cli import main
sys.exit(main(sys.argv[1:]))
"""
EXTRAS = {"[video]": ("imageio", "imageio_ffmpeg"), "[app]": ("gradio",), "[serve]": ("ray",)}


PLACEHOLDERS = {"<a 5,000-character path>": LONG, "<x = 1; written 300 times>": "x = 1; " * 300}


def table_rows() -> list[tuple[str, str, tuple[str, ...]]]:
    """(command line, expected stderr line, modules hidden) of each row of the README's and docs/errors.md's tables
    of bad command-line input."""
    rows = []
    for document in (ROOT / "README.md", ROOT / "docs" / "errors.md"):
        for line in document.read_text().splitlines():
            match = re.fullmatch(r"\| `(mmspec [^`]*)`( without the `(\[\w+\])` extra)? \| `([^`]*)` \|", line)
            if match:
                command = match.group(1)
                for placeholder, text in PLACEHOLDERS.items():
                    command = command.replace(placeholder, text)
                rows.append((command, match.group(4), EXTRAS[match.group(3)] if match.group(3) else ()))
    return rows


ROWS = table_rows()


def test_the_table_covers_every_command_and_the_issue_s_cases():
    commands = [command for command, _, _ in ROWS]
    assert len(ROWS) >= 40
    assert {shlex.split(c)[1] for c in commands} == {"generate", "text", "video", "demo", "serve"}
    for case in ('--out /nonexistent/dir/x.png', '--out x.txt', 'generate ""', '--frames 0', '--frames -5',
                 'text ""', '--n 0', "--out rollout.mp4", LONG):
        assert any(case in c for c in commands), case


@pytest.mark.parametrize("command,expected,hidden", ROWS, ids=[c[:70] for c, _, _ in ROWS])
def test_bad_input_fails_in_one_line_before_any_model_loads(command, expected, hidden, tmp_path):
    argv = shlex.split(command)[1:]
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", PRELUDE.format(hidden=hidden), *argv], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    seconds = time.perf_counter() - started
    assert run.returncode == 2, run.stderr
    assert run.stderr == expected + "\n"  # one line, exactly the table's; no traceback
    assert run.stdout == "" and list(tmp_path.iterdir()) == []
    assert seconds < 10  # an answer, not a model load (which the blocked torch import rules out anyway)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("command,expected", [
    (["generate", "a red circle", "--device", "cuda"], "mmspec generate: error: --device cuda: no CUDA device here"),
    (["text", "x = 1", "--device", "cuda:0"], "mmspec text: error: --device cuda:0: no CUDA device here"),
    (["video", "--actions", "right", "--device", "tpu"],
     "mmspec video: error: --device must be auto, cpu, cuda or cuda:N, got 'tpu'"),
])
def test_a_device_the_machine_lacks_is_one_line_before_any_model_loads(command, expected, tmp_path):
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "mmspec.cli", *command], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    seconds = time.perf_counter() - started
    assert run.returncode == 2 and run.stdout == "" and list(tmp_path.iterdir()) == []
    assert len(run.stderr.splitlines()) == 1 and run.stderr.startswith(expected), run.stderr
    assert seconds < 2, f"{seconds:.1f} s"  # torch imported for the check, no model loaded


def test_what_only_the_loaded_model_can_judge_is_one_line_too(tmp_path, capsys):
    """An image size the model cannot make and a released checkpoint missing a weight: exit 2, one line that names
    what is wrong, nothing written."""
    from tests.models.test_llamagen import write_release

    release = tmp_path / "release"
    write_release(release, drop="layers.0.feed_forward.w2.weight")
    cases = [
        (["generate", "a red circle", "--height", "100"], "mmspec generate: error: this LlamaGen model cannot "
         "generate a 100x64 (height x width) image; its token grid makes 64x64 only"),
        (["generate", "a red circle", "--model", str(release)], f"mmspec generate: error: {release / 't2i_tiny_64.pt'}"
         " lacks 1 weight(s) of this LlamaGenTransformer: layers.0.feed_forward.w2.weight"),
    ]
    for argv, expected in cases:
        out = tmp_path / "out.png"
        with pytest.raises(SystemExit) as exit_info:
            main([*argv, "--out", str(out)])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1] == expected
        assert not out.exists() and sorted(tmp_path.iterdir()) == [release]


@pytest.mark.parametrize("command", [["--help"], ["generate", "--help"], ["text", "--help"], ["video", "--help"],
                                     ["demo", "--help"]])
def test_help_answers_at_once_without_torch(command, report):
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", PRELUDE.format(hidden=()), *command], capture_output=True,
                         text=True, timeout=60)
    seconds = time.perf_counter() - started
    report(f"mmspec {' '.join(command)}: {seconds:.2f} s")
    assert run.returncode == 0 and run.stdout.startswith("usage: mmspec") and run.stderr == ""
    assert seconds < 3  # about 0.1 s on 2 CPU cores; generous for a busy machine


def test_a_batch_larger_than_memory_is_one_line_before_any_model_loads(tmp_path, capsys):
    """--n 100,000,000 once built that many generators after loading the model; the KV caches it needs are measured
    against the memory free here first (the exact figures are the machine's)."""
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "x", "--n", "100000000", "--out", str(tmp_path / "x.png")])
    assert exit_info.value.code == 2 and list(tmp_path.iterdir()) == []
    assert re.fullmatch(r"mmspec generate: error: --n: 100,000,000 images need about [\d,.]+ GiB of KV cache; this "
                        r"machine has [\d.]+ GiB free \(at most [\d,]+ images at once\)\n", capsys.readouterr().err)


@pytest.mark.parametrize("command", ["demo", "serve"])
def test_a_port_in_use_is_one_line_before_any_model_loads(command, tmp_path):
    """A second `mmspec serve` on a port in use would share it with the first (Ray Serve binds with SO_REUSEPORT) and
    the demo would fail after loading its models: both refuse at once. Its companion: a free port passes."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        run = subprocess.run([sys.executable, "-c", PRELUDE.format(hidden=()), command, "--port", str(port)],
                             cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stdout == "" and list(tmp_path.iterdir()) == []
    assert run.stderr == (f"mmspec {command}: error: --port {port}: something already serves on 127.0.0.1:{port} (an "
                          "earlier instance still running?); stop it or choose another port\n")
    check_port_free("127.0.0.1", port)  # let go: free again


def test_a_host_this_machine_cannot_serve_on_is_named():
    with pytest.raises(UsageError, match=r"^--host '192\.0\.2\.77': cannot serve on it here \(Cannot assign"):
        check_port_free("192.0.2.77", 8000)  # TEST-NET-1: no interface here has it
