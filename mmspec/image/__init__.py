"""Discrete-token image AR decoding: the model adapter protocol and the decoding components (`AR()`, speculative
Jacobi decoding `SJD(...)` with its coupled successors, draft-model speculative decoding `DraftModel(...)`), exact or
with LANTERN relaxed acceptance (`mmspec.core.acceptance.Lantern`), and parallel Jacobi decoding over image rows
`PJD(...)` (lossy)."""

from mmspec.image.decoding import AR, DecodeStep, ImageDecoding
from mmspec.image.draft_model import DraftModel
from mmspec.image.jacobi import COUPLINGS, INITS, SJD
from mmspec.image.lantern import NeighbourTable
from mmspec.image.parallel import PJD
from mmspec.image.protocol import DiscreteImageModel, ImageLogits
from mmspec.image.registry import DECODINGS, get_decoding

__all__ = [
    "AR", "COUPLINGS", "DECODINGS", "INITS", "PJD", "SJD", "DecodeStep", "DiscreteImageModel", "DraftModel",
    "ImageDecoding", "ImageLogits", "NeighbourTable", "get_decoding",
]
