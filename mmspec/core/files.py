"""Files written whole or not at all, and prompt files read."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable
from pathlib import Path

PARTIAL = ".partial"  # in the name of a file `write_atomically` has not renamed yet


def remove_partial_files(folder: str | os.PathLike) -> int:
    """Remove what writers killed mid-write left in `folder` (their temporary files); how many."""
    found = list(Path(folder).glob(f".*{PARTIAL}*"))
    for path in found:
        path.unlink(missing_ok=True)
    return len(found)


def write_atomically(save: Callable[[str], object], path: str | os.PathLike) -> None:
    """`save(file)` into a temporary file beside `path`, then renamed to it: a reader never sees part of it, and a
    failed write leaves nothing behind."""
    target = Path(path)
    partial = target.with_name(f".{target.name}.{os.getpid()}{PARTIAL}{target.suffix}")
    try:
        save(str(partial))
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def read_prompts(path: str | os.PathLike, argument: str = "prompts") -> list[str]:
    """Prompts from a plain-text file (one per line), a TSV file (its `caption` column if the header has one, else
    the last column) or a JSON file (a list of strings, a list of {"caption": ...}, or COCO caption annotations
    {"annotations": [{"caption": ...}, ...]}); blank ones dropped. ValueError naming `argument` for a missing file or
    one without prompts."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{argument}: no file at {str(path)!r}")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        data = json.loads(text)
        items = data["annotations"] if isinstance(data, dict) and "annotations" in data else data
        if not isinstance(items, list):
            raise ValueError(f"{argument}: {str(path)!r} holds neither a list nor COCO caption annotations")
        prompts = [item["caption"] if isinstance(item, dict) else item for item in items]
    elif path.suffix == ".tsv":
        rows = [row for row in csv.reader(text.splitlines(), delimiter="\t") if row]
        column = rows[0].index("caption") if rows and "caption" in rows[0] else -1
        prompts = [row[column] for row in (rows[1:] if column >= 0 else rows)]
    else:
        prompts = text.splitlines()
    prompts = [p.strip() for p in prompts if isinstance(p, str) and p.strip()]
    if not prompts:
        raise ValueError(f"{argument}: {str(path)!r} has no prompts")
    return prompts
