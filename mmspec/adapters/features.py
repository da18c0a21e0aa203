"""What a draft head reads of its target (EAGLE, Hydra, EAGLE-3; judge decoding's judge, SpecDec++'s acceptance head):
`bind_head` reads a head's tokens and features through a model's "features" capability (its embedding and LM head as
modules, `feature_readout`, and its decoder layers, `feature_layers`), for text and image targets alike, and a
`FeatureTap` catches the input of the LM head (and the chosen layers' outputs) in every forward of the target.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mmspec.core.model import require


def bind_head(head, model) -> FeatureTap:
    """Read the head's tokens and features through `model`'s embedding and LM head (the model protocol's "features"
    capability: `feature_readout()`, `feature_layers()`, for text and image targets alike); the tap that catches
    what the head reads of the model's forwards."""
    require(model, {"features"}, "a draft head")
    embedding, lm_head = model.feature_readout()
    head.bind(embedding, lm_head)
    return FeatureTap.of(lm_head, head.tapped_layers(model.feature_layers()))


class FeatureTap:
    """What a head reads of a target's last forward ([R, W, w], `features`): the input of its LM head, the feature
    ([R, W, d], w = d), after the outputs of the decoder `layers` an EAGLE-3 head fuses (w = (k + 1) d for k of
    them), each cut to the feature's last W columns (the LM head reads the last columns of the final layer's output).
    Forward hooks on the modules, shared by every drafter that reads the same ones (`FeatureTap.of`), and by a
    drafter's step and its captured copy (the hooks write this object, whichever step runs the forward)."""

    capture_static = True

    def __init__(self, lm_head: torch.nn.Module, layers: Sequence[torch.nn.Module] = ()):
        self.feature: torch.Tensor | None = None
        self.layer_outputs: list[torch.Tensor | None] = [None] * len(layers)
        self.handles = [lm_head.register_forward_pre_hook(self._keep_feature)]
        self.handles += [layer.register_forward_hook(self._keeper(i)) for i, layer in enumerate(layers)]

    def _keep_feature(self, module, inputs) -> None:
        self.feature = inputs[0]

    def _keeper(self, index: int):
        def keep(module, inputs, output) -> None:  # transformers' decoder layers may return (hidden, ...) tuples
            self.layer_outputs[index] = output[0] if isinstance(output, tuple) else output
        return keep

    @property
    def features(self) -> torch.Tensor:
        if not self.layer_outputs:
            return self.feature
        W = self.feature.shape[1]
        return torch.cat([*(output[:, -W:] for output in self.layer_outputs), self.feature], -1)

    @classmethod
    def of(cls, lm_head: torch.nn.Module, layers: Sequence[torch.nn.Module] = ()) -> FeatureTap:
        """The tap on `lm_head` and `layers` (in this order), made on first use."""
        taps = lm_head.__dict__.setdefault("_feature_taps", {})
        key = tuple(id(layer) for layer in layers)
        if key not in taps:
            taps[key] = cls(lm_head, layers)
        return taps[key]
