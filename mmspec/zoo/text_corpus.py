"""The offline corpus of the embedded text pair: the Python standard library's own source.

Every machine with CPython has it, so the text models train without any download. Files are split into train and
held-out by a hash of their path relative to the stdlib root, so the split is stable across machines that share a
Python version (the shipped models were trained on CPython 3.11.7; see the model card).
"""

from __future__ import annotations

import codeop
import hashlib
import sysconfig
import warnings
from pathlib import Path

HELD_OUT_EVERY = 20  # 1 file in 20 (by path hash) is held out for perplexity and benchmark prompts
MAX_FILE_BYTES = 400_000
EXCLUDED_PARTS = frozenset({"site-packages", "pydoc_data", "__pycache__"})


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(relative_path: str) -> bool:
    digest = hashlib.sha1(relative_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "little") % HELD_OUT_EVERY == 0


def corpus_files(split: str, root: Path | None = None) -> list[Path]:
    """Sorted `.py` files of the standard library in `split` ("train" or "held_out")."""
    if split not in ("train", "held_out"):
        raise ValueError(f"split must be 'train' or 'held_out', got {split!r}")
    root = stdlib_root() if root is None else root
    files = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if EXCLUDED_PARTS.intersection(path.relative_to(root).parts) or path.stat().st_size > MAX_FILE_BYTES:
            continue
        if is_held_out(relative) == (split == "held_out"):
            files.append(path)
    return files


def read_texts(files: list[Path]) -> list[str]:
    texts = []
    for path in files:
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:  # a few test fixtures are deliberately not UTF-8
            continue
    return texts


def held_out_prompts(n: int, min_chars: int = 24, opening: str = "def ") -> list[str]:
    """`n` code prompts from held-out files (`code_prompts`)."""
    return code_prompts(n, "held_out", min_chars, opening)


def code_prompts(n: int, split: str = "held_out", min_chars: int = 24, opening: str = "def ") -> list[str]:
    """`n` code prompts from the files of `split`: the first line of each `def` that is followed by its body.

    A prompt is the signature line plus the line after it, so models see a little context; prompts are spread over the
    files (round robin) and deterministic. opening: how the signature line starts once indentation is stripped
    (`"def test"`: only unit tests, a narrower domain than the corpus the models trained on).
    """
    per_file: list[list[str]] = []
    for text in read_texts(corpus_files(split)):
        lines = text.splitlines()
        found = []
        for i, line in enumerate(lines[:-1]):
            if line.lstrip().startswith(opening) and line.rstrip().endswith(":") and len(line) >= min_chars:
                found.append(line + "\n" + lines[i + 1] + "\n")
        if found:
            per_file.append(found)
    prompts: list[str] = []
    depth = 0
    while len(prompts) < n and any(depth < len(f) for f in per_file):
        prompts.extend(f[depth] for f in per_file if depth < len(f))
        depth += 1
    if len(prompts) < n:
        raise ValueError(f"the {split} split has only {len(prompts)} prompts, asked for n={n}")
    return prompts[:n]


def syntax_valid(code: str) -> bool:
    """Whether `code` (a prompt and its completion) holds no syntax error up to its last complete line: Python's own
    incremental compiler (`codeop`) takes it as complete or as the start of a longer program. An indented prompt (a
    method) is read inside a block opened before it. Completions cut at a token budget end mid-block; a real error
    is what it rejects."""
    text = code[: code.rfind("\n") + 1]
    if text[:1].isspace():
        text = "if True:\n" + text
    try:
        with warnings.catch_warnings():  # invalid escapes and the like warn; they are not syntax errors
            warnings.simplefilter("ignore")
            codeop.compile_command(text, "<completion>", "exec")
    except (SyntaxError, ValueError, OverflowError):
        return False
    return True
