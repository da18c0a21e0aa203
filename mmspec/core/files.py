"""Files written whole or not at all."""

from __future__ import annotations

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
