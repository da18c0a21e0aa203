"""Next-frame video: frame speculation with per-frame cache commit and rollback."""

from mmspec.video.cache import FrameKVCache

__all__ = ["FrameKVCache"]
