"""The repository passes ruff with the rules pyproject.toml names (pyflakes, pycodestyle, import order), so style
breaks fail CI as test failures do; a file with an unused import is refused."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *args], cwd=ROOT,
                          capture_output=True, text=True)


def test_the_repository_passes_ruff():
    result = ruff(".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_companion_an_unused_import_is_refused(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import os\n")
    result = ruff("--config", str(ROOT / "pyproject.toml"), str(broken))
    assert result.returncode == 1 and "F401" in result.stdout
