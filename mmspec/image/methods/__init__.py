"""The built-in image decodings, registered by name (`mmspec.core.registry.decodings("image")`): importing this
package registers them. Each module holds one method's settings; its step lives with the tensor code. Nothing here
imports torch."""

from mmspec.core.component import component_from

# isort: off
from mmspec.image.methods import ar, sjd, draft, heads, pjd  # noqa: F401  registers the built-in methods, in this order
# isort: on
from mmspec.image.methods.base import ImageDecoding

__all__ = ["ImageDecoding", "get_decoding"]


def get_decoding(decoding, **settings) -> ImageDecoding:
    """An image decoding from an object, a saved config dict, or a registered name and its settings (`"sjd",
    window=16`; the rules' flat spellings too: `acceptance="lantern", lantern_k=100`). Settings left as None take the
    defaults. `"auto"` is a pipeline's choice, not a component (`mmspec.image.policy`)."""
    return component_from(decoding, "image", **settings)
