"""Where mmspec keeps what it computes once per machine (LANTERN neighbour tables, window cost curves)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$MMSPEC_CACHE_DIR, default ~/.cache/mmspec."""
    return Path(os.environ.get("MMSPEC_CACHE_DIR", Path.home() / ".cache" / "mmspec"))
