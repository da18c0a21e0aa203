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
    banned = [m for m in imported_modules(path) if m.split(".")[0] in ("gradio", "torchmetrics", "pipelines", "apps", "eval")]
    assert banned == []
