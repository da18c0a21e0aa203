"""Next-frame video: frame speculation with per-frame cache commit and rollback."""

from mmspec.video.cache import FrameKVCache
from mmspec.video.speculation import FrameSession, FrameSpeculation, FrameStats

__all__ = ["FrameKVCache", "FrameSession", "FrameSpeculation", "FrameStats"]
