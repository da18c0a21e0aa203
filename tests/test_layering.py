"""DESIGN.md §1 layering: mmspec.core imports nothing else from mmspec; the engine never imports gradio or metrics."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize("path", sorted((ROOT / "mmspec" / "core").glob("*.py")), ids=lambda p: p.name)
def test_core_imports_only_core(path):
    upward = [m for m in imported_modules(path) if m.startswith("mmspec") and not m.startswith("mmspec.core")]
    assert upward == []


@pytest.mark.parametrize("path", sorted((ROOT / "mmspec").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_engine_has_no_app_or_metric_imports(path):
    """The command line (mmspec/cli.py) sits on top of the stack, like apps/: it alone may load pipelines and launch
    the demo (apps), and it imports Gradio only to say that it is missing."""
    top = path.name == "cli.py"
    banned = {"torchmetrics", "eval"} | (set() if top else {"gradio", "apps", "pipelines"})
    assert [m for m in imported_modules(path) if m.split(".")[0] in banned] == []


@pytest.mark.parametrize("path", sorted((ROOT / "mmspec" / "image").glob("*.py")), ids=lambda p: p.name)
def test_decoders_never_import_a_model_family(path):
    assert [m for m in imported_modules(path) if m.startswith("mmspec.models")] == []
