"""Decoding methods by name, so pipelines and the CLI take `decoding="sjd"` plus the method's options."""

from __future__ import annotations

import inspect

from mmspec.image.decoding import ARDecoding, ImageDecoding
from mmspec.image.draft_model import DraftModelDecoding
from mmspec.image.jacobi import SJDDecoding
from mmspec.options import IMAGE_DECODINGS

# every name of IMAGE_DECODINGS but "auto", which pipelines resolve (mmspec.image.policy) before they get here
DECODINGS: dict[str, type] = {"ar": ARDecoding, "sjd": SJDDecoding, "draft": DraftModelDecoding}


def get_decoding(decoding: str | ImageDecoding, **options) -> ImageDecoding:
    """A decoding instance from its name (see `DECODINGS`) and options (e.g. `window=16` for "sjd"), or an already
    built decoding object (then no options). Options left as None take the method's defaults."""
    options = {key: value for key, value in options.items() if value is not None}
    if isinstance(decoding, str):
        if decoding == "auto":
            raise ValueError('decoding="auto" needs the model, device and batch size: pipelines resolve it, or call '
                             "mmspec.image.policy.DecodingPolicy.choose")
        if decoding not in DECODINGS:
            raise ValueError(f"decoding must be one of {IMAGE_DECODINGS} or a decoding object, got {decoding!r}")
        method = DECODINGS[decoding]
        accepted = set(inspect.signature(method).parameters)
        unknown = sorted(set(options) - accepted)
        if unknown:
            raise ValueError(
                f"decoding={decoding!r} does not take {unknown}; its options are {sorted(accepted) or 'none'}"
            )
        return method(**options)
    if not callable(decoding) or not hasattr(decoding, "name"):
        raise TypeError(f"decoding must be a name or an ImageDecoding object, got {type(decoding).__name__}")
    if options:
        raise ValueError(f"options {sorted(options)} only apply to a decoding given by name, not to {decoding!r}")
    return decoding
