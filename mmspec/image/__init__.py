"""Discrete-token image AR decoding: the model adapter protocol and the decoding methods (AR baseline, speculative
Jacobi decoding and its coupled successors)."""

from mmspec.image.decoding import ARDecoding, DecodeStep, ImageDecoding
from mmspec.image.jacobi import COUPLINGS, INITS, SJDDecoding
from mmspec.image.protocol import DiscreteImageModel, ImageLogits
from mmspec.image.registry import DECODINGS, get_decoding

__all__ = [
    "COUPLINGS", "DECODINGS", "INITS", "ARDecoding", "DecodeStep", "DiscreteImageModel", "ImageDecoding", "ImageLogits",
    "SJDDecoding", "get_decoding",
]
