"""Judge decoding's judge (Bachmann et al. 2025, arXiv 2501.19309): a linear layer on the target's own feature of a
drafted token, the input of its LM head at the token's slot in the verification forward, scoring whether the token
is good enough to keep although the exact rule would reject it. Trained per target and task
(`python -m mmspec.zoo.train_judge`); the rule that reads it is `mmspec.core.rules.judge.Judge`.
"""

from __future__ import annotations

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn

from mmspec.adapters.features import FeatureTap
from mmspec.core.model import require


class JudgeHead(ModelMixin, ConfigMixin):
    """score(features [..., d]) -> [...] in (0, 1): sigmoid(w . f + b). threshold: the score above which the rule
    keeps a token by default (chosen in training for the task metric); training: how it was trained (a record)."""

    @register_to_config
    def __init__(self, feature_size: int = 192, threshold: float = 0.5, training: dict | None = None):
        super().__init__()
        if not 0 < threshold < 1:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}")
        self.linear = nn.Linear(feature_size, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """[..., d] -> [...] logits."""
        return self.linear(features.to(self.linear.weight.dtype)).squeeze(-1)

    def score(self, features: torch.Tensor) -> torch.Tensor:
        return self(features).sigmoid()

    def attach(self, target) -> None:
        """Read `target`'s features (a model adapter with the "features" capability, `mmspec.adapters`): a tap on
        its LM head's input, shared with the draft heads (`FeatureTap.of`), which holds the last forward's
        [B, W, d]."""
        require(target, {"features"}, "JudgeHead")
        if target.feature_size != self.config.feature_size:
            raise ValueError(f"the judge reads features of width {self.config.feature_size}; the target's are "
                             f"{target.feature_size} wide")
        self.__dict__["tap"] = FeatureTap.of(target.feature_readout()[1])  # not a submodule: never saved with it

    @property
    def features(self) -> torch.Tensor:
        """[B, W, d]: the attached target's last forward's features."""
        if "tap" not in self.__dict__:
            raise ValueError("the judge reads a target's features: call judge.attach(target) first")
        return self.tap.feature
