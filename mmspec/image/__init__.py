"""Discrete-token image AR decoding: the model adapter protocol and the decoding methods (AR baseline, ...)."""

from mmspec.image.decoding import DECODINGS, ARDecoding, DecodeStep, ImageDecoding, get_decoding
from mmspec.image.protocol import DiscreteImageModel, ImageLogits

__all__ = [
    "DECODINGS", "ARDecoding", "DecodeStep", "DiscreteImageModel", "ImageDecoding", "ImageLogits", "get_decoding",
]
