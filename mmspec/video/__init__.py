"""Next-frame video: frame speculation with per-frame cache commit and rollback; the decodings `AR()` and
`FrameSpeculation(...)` are `mmspec.video.methods`. Names are exported lazily, so the decodings' settings load without
torch."""

from mmspec.core.lazy import lazy_exports

_EXPORTS = {
    "AR": "mmspec.video.methods",
    "FrameSpeculation": "mmspec.video.methods",
    "VideoDecoding": "mmspec.video.methods",
    "FrameKVCache": "mmspec.video.cache",
    "FrameSession": "mmspec.video.speculation",
    "FrameStats": "mmspec.video.speculation",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
