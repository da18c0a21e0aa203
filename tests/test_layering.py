"""The package graph (docs/architecture.md), with no exceptions:

    mmspec.core <- mmspec.adapters <- mmspec.{image, continuous, video, text, zoo} <- mmspec.models <- mmspec.pipelines
        <- mmspec.serving <- mmspec.{apps, eval, zoo training scripts} <- mmspec.cli

A module imports only its own unit or a unit of a lower layer: siblings never import each other (the decoders never
import a model family, `eval` never imports a training script, `apps` never imports the CLI or `eval`), nothing in the
package imports the `mmspec` facade (it exists for users), Gradio is imported by `mmspec.apps` alone, torchmetrics by
`mmspec.eval` alone and Ray (and FastAPI) by `mmspec.serving` alone, `mmspec.core` imports torch and the standard
library only (no transformers: the text engine with its transformers caches is `mmspec.adapters`), and no file anywhere
imports the repository folders `pipelines`, `apps`, `eval` as top-level modules (they install as `mmspec.pipelines`,
`mmspec.apps`, `mmspec.eval`). Every import counts, lazy ones inside functions and `TYPE_CHECKING` blocks included. No
two modules import each other, directly or through others (`circles`).
"""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = (
    ("mmspec.core",),
    ("mmspec.adapters",),  # the core's model protocol over model libraries (transformers)
    ("mmspec.image", "mmspec.continuous", "mmspec.video", "mmspec.text", "mmspec.zoo"),
    ("mmspec.models",),
    ("mmspec.pipelines",),
    ("mmspec.serving",),  # the pipelines behind an HTTP service and offline runs (Ray)
    ("mmspec.apps", "mmspec.eval", "mmspec.zoo.training"),
    ("mmspec.cli",),
)
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}
ONLY_IMPORTED_BY = {"gradio": "mmspec.apps", "torchmetrics": "mmspec.eval", "ray": "mmspec.serving",
                    "fastapi": "mmspec.serving"}
CORE_THIRD_PARTY = {"torch"}  # what mmspec.core may import besides the standard library and itself
REPOSITORY_FOLDERS = ("pipelines", "apps", "eval")  # importable only as mmspec.<name>


def package_roots(root: Path = ROOT) -> dict[Path, str]:
    """Folder -> package name, from pyproject.toml's setuptools package-dir (mmspec/ itself maps to itself)."""
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {root / "mmspec": "mmspec"} | {root / folder: name for name, folder in setuptools["package-dir"].items()}


def module_name(path: Path, roots: dict[Path, str]) -> str:
    folder = next(folder for folder in roots if path.is_relative_to(folder))
    parts = [roots[folder], *path.relative_to(folder).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module: str) -> str:
    """The layer unit of a module: `mmspec.<sub-package>`, with the zoo's training scripts a unit of their own."""
    parts = module.split(".")
    if parts[:2] == ["mmspec", "zoo"] and len(parts) > 2 and parts[2].startswith("train"):
        return "mmspec.zoo.training"
    return ".".join(parts[:2])


def imports_of(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, relative imports resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            name = ".".join(part for part in (base, node.module) if part)
            # `from mmspec.core import verify` imports the module mmspec.core.verify, not only mmspec.core
            found += [(node.lineno, name)] if node.module else [(node.lineno, f"{name}.{a.name}") for a in node.names]
    return found


def violations(files: list[Path], roots: dict[Path, str]) -> list[str]:
    """Every import in `files` that breaks the graph, as 'path:line: importer imports imported (why)'."""
    found = []
    for path in files:
        importer = module_name(path, roots) if any(path.is_relative_to(f) for f in roots) else None
        for line, imported in imports_of(path, importer or ""):
            top = imported.split(".")[0]
            why = None
            if top in REPOSITORY_FOLDERS:
                why = f"the repository folder {top}/ installs as mmspec.{top}"
            elif importer is None:
                pass  # tests and scripts outside the package may import any part of mmspec
            elif (unit_of(importer) == "mmspec.core" and top not in CORE_THIRD_PARTY | {"mmspec", "__future__"}
                  and top not in sys.stdlib_module_names):
                why = f"mmspec.core imports only torch and the standard library, not {top}"
            elif top in ONLY_IMPORTED_BY and unit_of(importer) != ONLY_IMPORTED_BY[top]:
                why = f"only {ONLY_IMPORTED_BY[top]} imports {top}"
            elif imported == "mmspec":
                why = "the mmspec facade is for users; import the defining module"
            elif top == "mmspec":
                mine, theirs = unit_of(importer), unit_of(imported)
                if mine == "mmspec":
                    pass  # the facade itself sits above everything
                elif mine not in RANK or theirs not in RANK:
                    why = f"{mine if mine not in RANK else theirs} has no place in the layers"
                elif mine != theirs and RANK[theirs] >= RANK[mine]:
                    why = f"{mine} (layer {RANK[mine]}) imports only lower layers, not {theirs} (layer {RANK[theirs]})"
            if why:
                found.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line}: "
                             f"{importer or path.name} imports {imported} ({why})")
    return found


def project_files() -> list[Path]:
    return sorted(p for folder in (*package_roots(), ROOT / "tests") for p in folder.rglob("*.py"))


def import_graph(files: list[Path], roots: dict[Path, str]) -> dict[str, set[str]]:
    """module -> the package modules it imports (every import, lazy ones included; `from a.b import c` counts as
    importing a.b.c when that is a module, else a.b)."""
    modules = {module_name(path, roots): path for path in files if any(path.is_relative_to(f) for f in roots)}
    graph = {}
    for module, path in modules.items():
        edges = set()
        for _, imported in imports_of(path, module):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != module:
                edges.add(imported)
        graph[module] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph`: its strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_anywhere():
    files = [p for p in project_files() if not p.is_relative_to(ROOT / "tests")]
    assert circles(import_graph(files, package_roots())) == []


def test_a_planted_import_circle_is_caught(tmp_path):
    """Mutation companion: two core modules that import each other (one lazily) form a circle."""
    package = tmp_path / "mmspec" / "core"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "grouped.py").write_text("from mmspec.core.verifier import residual\n")
    (package / "verifier.py").write_text("def verify():\n    from mmspec.core.grouped import Grouping\n")
    files = sorted(package.glob("*.py"))
    assert circles(import_graph(files, {tmp_path / "mmspec": "mmspec"})) == [["mmspec.core.grouped",
                                                                              "mmspec.core.verifier"]]


def test_every_package_module_has_a_layer():
    roots = package_roots()
    units = {unit_of(module_name(p, roots)) for p in project_files() if not p.is_relative_to(ROOT / "tests")}
    assert units - {"mmspec"} <= set(RANK), units - set(RANK)


def test_the_package_graph_holds():
    assert violations(project_files(), package_roots()) == []


PLANTED = {  # importer (a module path under the planted package) -> a line that breaks the graph
    "mmspec/core/planted.py": "from mmspec.image.jacobi import SJD",
    "mmspec/core/planted_text.py": "from mmspec.text.generate import speculative_generate",
    "mmspec/core/planted_transformers.py": "def lazy():\n    from transformers import DynamicCache",
    "mmspec/image/planted.py": "from mmspec.models.llamagen.gpt import LlamaGenTransformer",
    "mmspec/video/planted.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mmspec.models import x",
    "mmspec/image/planted_sibling.py": "import mmspec.continuous.diffusion",
    "mmspec/models/planted.py": "def lazy():\n    from mmspec.pipelines.auto import AutoARImagePipeline",
    "mmspec/pipelines/planted.py": "from mmspec.eval.metrics import clip_score",
    "mmspec/apps/planted.py": "from mmspec.cli import main",
    "mmspec/apps/planted_eval.py": "from mmspec.eval.metrics import clip_score",
    "mmspec/eval/planted.py": "from mmspec.zoo.train_mar import main",
    "mmspec/zoo/planted.py": "from mmspec.models.mar import KLAutoencoder",
    "mmspec/pipelines/llamagen/planted.py": "from ...apps import demo",  # relative, resolved to mmspec.apps
    "mmspec/models/planted_facade.py": "from mmspec import LlamaGenPipeline",
    "mmspec/pipelines/planted_gradio.py": "import gradio as gr",
    "mmspec/models/planted_metrics.py": "from torchmetrics.image.fid import FrechetInceptionDistance",
    "mmspec/eval/planted_top_level.py": "from pipelines.llamagen import LlamaGenPipeline",
    "mmspec/image/planted_unknown.py": "from mmspec.utils import helper",
}


@pytest.mark.parametrize("relative", PLANTED, ids=lambda r: r.removeprefix("mmspec/").removesuffix(".py"))
def test_a_planted_import_that_breaks_the_graph_is_caught(tmp_path, relative):
    """Mutation companion: one import against the graph, planted in a temporary package tree, is reported."""
    planted = tmp_path / relative
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_text("import torch\n\nfrom mmspec.core.probs import SamplingConfig\n" + PLANTED[relative] + "\n")
    found = violations([planted], {tmp_path / "mmspec": "mmspec"})
    assert len(found) == 1, found


def test_allowed_imports_are_not_reported(tmp_path):
    planted = tmp_path / "mmspec" / "pipelines" / "allowed.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("from mmspec.models.llamagen.gpt import LlamaGenTransformer\n"
                       "from mmspec.zoo import resolve_model\n"
                       "from mmspec.pipelines.ar_image import ARImagePipeline\n"
                       "from .ar_image import OUTPUT_TYPES\n"
                       "import mmspec.core.verify\n"
                       "from mmspec.video.protocol import NextFrameModel\n")
    assert violations([planted], {tmp_path / "mmspec": "mmspec"}) == []
