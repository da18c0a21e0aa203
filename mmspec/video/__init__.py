"""Next-frame video: frame speculation with per-frame cache commit and rollback; the decodings `AR()` and
`FrameSpeculation(...)` are `mmspec.video.methods`. Names are exported lazily, so the decodings' settings load without
torch."""

import importlib

_EXPORTS = {
    "AR": "mmspec.video.methods",
    "FrameSpeculation": "mmspec.video.methods",
    "VideoDecoding": "mmspec.video.methods",
    "FrameKVCache": "mmspec.video.cache",
    "FrameSession": "mmspec.video.speculation",
    "FrameStats": "mmspec.video.speculation",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mmspec.video' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
