"""mmspec: speculative decoding for autoregressive image, video and text generation."""

from mmspec.core import speculative_generate

__version__ = "0.1.0"
__all__ = ["speculative_generate"]
