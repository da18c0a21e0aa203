"""Discrete-token image AR decoding: the decodings (`mmspec.image.methods`: `AR()`, speculative Jacobi decoding
`SJD(...)` with its coupled successors and frontier trees, draft-model speculative decoding `DraftModel(...)`, parallel
Jacobi decoding over image rows), exact or with a relaxed acceptance rule (`mmspec.core.rules`), the loop they
share (`mmspec.image.loop`) and the model adapter protocol (`mmspec.image.protocol`). Names are exported lazily, so
the decodings' settings load without torch."""

from mmspec.core.lazy import lazy_exports

_EXPORTS = {
    "AR": "mmspec.image.methods.ar",
    "SJD": "mmspec.image.methods.sjd",
    "COUPLINGS": "mmspec.image.methods.sjd",
    "INITS": "mmspec.image.methods.sjd",
    "DraftModel": "mmspec.image.methods.draft",
    "DraftHeads": "mmspec.image.methods.heads",
    "ImageDecoding": "mmspec.image.methods.base",
    "get_decoding": "mmspec.image.methods",
    "DecodeStep": "mmspec.image.loop",
    "DiscreteImageModel": "mmspec.image.protocol",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
