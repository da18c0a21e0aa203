"""Discrete-token image AR decoding: the model adapter protocol and the decoding methods (AR baseline, speculative
Jacobi decoding and its coupled successors, draft-model speculative decoding), exact or with LANTERN relaxed
acceptance."""

from mmspec.image.decoding import ARDecoding, DecodeStep, ImageDecoding
from mmspec.image.draft_model import DraftModelDecoding
from mmspec.image.jacobi import COUPLINGS, INITS, SJDDecoding
from mmspec.image.lantern import ACCEPTANCES, LanternAcceptance, NeighbourTable
from mmspec.image.protocol import DiscreteImageModel, ImageLogits
from mmspec.image.registry import DECODINGS, get_decoding

__all__ = [
    "ACCEPTANCES", "COUPLINGS", "DECODINGS", "INITS", "ARDecoding", "DecodeStep", "DiscreteImageModel",
    "DraftModelDecoding", "ImageDecoding", "ImageLogits", "LanternAcceptance", "NeighbourTable", "SJDDecoding",
    "get_decoding",
]
