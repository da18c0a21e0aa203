"""What `pip install .` puts on a user's machine: one import name, `mmspec`. The repository's pipelines/, apps/ and
eval/ install as mmspec.pipelines, mmspec.apps and mmspec.eval; nothing else lands in site-packages; the installed
package works from any directory; `import mmspec` is lazy."""

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.test_layering import package_roots

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject():
    """setuptools installs only the listed packages: a new sub-package must be added there (or it is lost)."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {
        ".".join([name, *init.parent.relative_to(folder).parts])
        for folder, name in package_roots().items() for init in folder.rglob("__init__.py")
    }
    assert listed == on_disk


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(out), str(ROOT)], check=True, capture_output=True)
    return next(out.glob("mmspec-*.whl"))


@pytest.mark.slow  # a wheel built and installed: the slow tier
def test_the_wheel_holds_one_top_level_name(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        top_level = archive.read(next(n for n in names if n.endswith(".dist-info/top_level.txt"))).decode().split()
    assert top_level == ["mmspec"]
    assert {name.split("/")[0] for name in names} == {"mmspec", wheel.name.split("-py3")[0] + ".dist-info"}
    for module in ("mmspec/pipelines/llamagen/pipeline_llamagen.py", "mmspec/apps/demo.py", "mmspec/eval/quality.py",
                   "mmspec/zoo/shapes/model_index.json", "mmspec/zoo/shapes/transformer/config.json",
                   "mmspec/py.typed", "mmspec/models/llamagen/captions.py"):
        assert module in names
    assert any(n.startswith("mmspec/zoo/shapes/transformer/") and n.endswith(".safetensors") for n in names)


def run_installed(site: Path, code: list[str]) -> subprocess.CompletedProcess:
    """`python <code>` from `/` with the installed wheel first on the path (the repository is not on it)."""
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, *code], cwd="/", env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # a wheel built and installed: the slow tier
def test_the_installed_package_works_from_any_directory(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile", "--target",
                    str(site), str(wheel)], check=True, capture_output=True)
    importable = sorted(p.name for p in site.iterdir() if not p.name.endswith(".dist-info") and p.name != "bin")
    assert importable == ["mmspec"] and (site / "bin" / "mmspec").is_file()  # bin/: the console script
    for name in ("pipelines", "eval", "apps"):
        result = run_installed(site, ["-c", f"import {name}"])
        assert result.returncode != 0 and f"No module named '{name}'" in result.stderr
    result = run_installed(site, ["-c", "import mmspec; from mmspec import LlamaGenPipeline; "
                                        "print(mmspec.__file__, LlamaGenPipeline.__module__)"])
    assert result.returncode == 0, result.stderr
    module = "mmspec.pipelines.llamagen.pipeline_llamagen"
    assert result.stdout.split() == [str(site / "mmspec" / "__init__.py"), module]
    result = run_installed(site, ["-m", "mmspec.eval.quality", "--help"])
    assert result.returncode == 0 and "usage:" in result.stdout, result.stderr


def test_import_mmspec_loads_no_model_code():
    code = ("import sys, mmspec; heavy = sorted(m for m in ('torch', 'diffusers', 'transformers', 'mmspec.pipelines') "
            "if m in sys.modules); print(heavy)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
