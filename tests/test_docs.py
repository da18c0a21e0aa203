"""The README, docs/ and the zoo's model card say nothing that does not work.

Every fenced code block is one of three kinds, told by the comment on the line above it:
- no comment: Python, run as written (in a temporary directory) and must print;
- `<!-- arguments checked: why -->`: shell commands (`mmspec ...`, `python -m mmspec...`, `accelerate launch -m ...`),
  each parsed by its own command's argument parser, which must accept it — a full run is minutes to hours;
- `<!-- not run: why -->`: what cannot run here (a GPU and real weights, an install into this environment).
Every link points inside the repository, at a file (and heading) that exists; every dotted name a document gives in
backticks (`mmspec.core.rules.lantern.Relaxation`) imports; the README stays under 350 lines.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "mmspec" / "zoo" / "README.md"]
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>\w*)\n(?P<body>.*?)^(?P=indent)```", re.M | re.S)
MARKER = re.compile(r"<!-- (?P<kind>not run|arguments checked): (?P<why>.+?) -->\s*$")
LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)\)")


@dataclass(frozen=True)
class Block:
    document: Path
    line: int
    lang: str
    body: str
    kind: str  # "run", "arguments checked" or "not run"

    def __str__(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"


def blocks(document: Path) -> list[Block]:
    text = document.read_text()
    found = []
    for fence in FENCE.finditer(text):
        line = text.count("\n", 0, fence.start()) + 1
        before = text[: fence.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        body = "\n".join(row[len(fence["indent"]):] for row in fence["body"].split("\n"))
        found.append(Block(document, line, fence["lang"], body, marker["kind"] if marker else "run"))
    return found


BLOCKS = [block for document in DOCUMENTS for block in blocks(document)]


def test_every_block_runs_or_says_why_not():
    assert BLOCKS and all(b.lang in ("python", "py", "bash", "text") for b in BLOCKS), [str(b) for b in BLOCKS]
    shell_unmarked = [str(b) for b in BLOCKS if b.lang == "bash" and b.kind == "run"]
    assert shell_unmarked == [], "shell blocks need a marker (arguments checked / not run)"


@pytest.mark.slow  # every example end to end (models trained, eval runs): the slow tier
@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "run" and b.lang in ("python", "py")], ids=str)
def test_python_block_runs(block, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples may write files
    exec(compile(block.body, str(block), "exec"), {"__name__": "__doc_example__"})
    assert capsys.readouterr().out.strip(), "the example prints what it shows"


class Parsed(Exception):  # noqa: N818 — a signal, not an error
    """Raised by the patched `parse_args` once a command's own parser has accepted its arguments."""


def commands(body: str) -> list[list[str]]:
    """The command lines of a shell block: continuations joined, comments dropped, `&&` chains split."""
    joined = body.replace("\\\n", " ")
    found = []
    for line in joined.split("\n"):
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            found.append(words[:cut])
            words = words[cut + 1:]
    return found


def entry_point(argv: list[str]) -> tuple[object, list[str]]:
    """(main function, its arguments) of `mmspec ...` or of any command that runs `-m mmspec.<module> ...`."""
    if argv[0] == "mmspec":
        return importlib.import_module("mmspec.cli").main, argv[1:]
    if "-m" in argv and argv[argv.index("-m") + 1].startswith("mmspec."):
        at = argv.index("-m")
        return importlib.import_module(argv[at + 1]).main, argv[at + 2:]
    raise AssertionError(f"not an mmspec command: {shlex.join(argv)}")


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "arguments checked"], ids=str)
def test_shell_block_arguments_are_accepted(block, monkeypatch):
    parse_args = argparse.ArgumentParser.parse_args

    def parse_then_stop(parser, args=None, namespace=None):
        parse_args(parser, args, namespace)  # exits with status 2 on arguments the parser refuses
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    for argv in commands(block.body):
        main, args = entry_point(argv)
        with pytest.raises(Parsed):
            main(args)


def test_a_refused_argument_is_caught():
    """Mutation companion: a misspelt flag fails the check above (argparse exits with 2 before `Parsed`)."""
    main, args = entry_point(commands("mmspec generate 'a red circle' --windw 8")[0])
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda d: str(d.relative_to(ROOT)))
def test_links_point_inside_the_repository_at_what_exists(document):
    for match in LINK.finditer(document.read_text()):
        target = match["target"]
        assert "://" not in target and not target.startswith("mailto:"), f"{document.name}: external link {target}"
        path, _, anchor = target.partition("#")
        linked = (document.parent / path).resolve() if path else document
        assert linked.is_file() and linked.is_relative_to(ROOT), f"{document.name}: {target} does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", linked.read_text(), re.M)
            assert anchor in {slug(h) for h in headings}, f"{document.name}: no heading #{anchor} in {path}"


def resolves(name: str) -> bool:
    """Whether `name` (a.b.c) is a module, or an attribute path inside the longest module prefix that imports."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        for attribute in parts[end:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda d: str(d.relative_to(ROOT)))
def test_dotted_names_exist(document):
    names = set(re.findall(r"`(mmspec(?:\.\w+)+)", document.read_text()))
    assert not [name for name in sorted(names) if not resolves(name)]


def test_a_moved_name_is_caught():
    assert resolves("mmspec.core.rules.lantern.Relaxation") and not resolves("mmspec.core.grouping.Grouping")


def test_readme_is_read_in_ten_minutes():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 350
