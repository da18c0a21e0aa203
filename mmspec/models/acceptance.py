"""`AcceptanceHead`: SpecDec++'s acceptance predictor (Huang et al. 2024, arXiv 2405.19715) for a draft model.

For a token x the draft model just drew, it predicts the probability that the target accepts it, from the draft
model's feature that produced x's law (the input of its LM head, h), x's embedding in the draft model, and three
statistics of the draft's temperature-1 law q there (log q(x), log max q, its entropy): a residual MLP, as the
paper's, with two outputs — greedy decoding (does the
target's argmax equal the draft's?) and sampling (min(1, p(x) / q(x)), the exact rule's acceptance of a sampled x).
`mmspec.core.drafting.stops.LearnedStop` stops a row's draft on it; `mmspec.zoo.train_acceptance` trains it.
"""

from __future__ import annotations

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn

STATISTICS = 3  # of the draft's law at a token (`AcceptanceHead.statistics`)


class ResidualBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm, self.linear = nn.LayerNorm(width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.linear(nn.functional.silu(self.norm(x)))


class AcceptanceHead(ModelMixin, ConfigMixin):
    """feature_size: the draft model's hidden width d; hidden: the MLP's width; layers: its residual blocks;
    stop_threshold: the stop rule's default thresholds (greedy, sampled) on the predicted probability that some
    draft token is rejected (`mmspec.zoo.train_acceptance` chooses them from the draft and target costs it
    measured); training: what training used and measured (the pair, the cost ratio, the examples)."""

    @register_to_config
    def __init__(self, feature_size: int = 128, hidden: int = 256, layers: int = 3,
                 stop_threshold: tuple[float, float] = (0.5, 0.5), training: dict | None = None):
        super().__init__()
        if len(stop_threshold) != 2 or not all(0 < h < 1 for h in stop_threshold):
            raise ValueError(f"stop_threshold must be two values in (0, 1) (greedy, sampled), got {stop_threshold}")
        self.inputs = nn.Linear(2 * feature_size + STATISTICS, hidden)
        self.blocks = nn.Sequential(*(ResidualBlock(hidden) for _ in range(layers)))
        self.out = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, 2))  # logits: greedy, sampled

    @property
    def stop_threshold(self) -> tuple[float, float]:
        """The stop rule's default thresholds (greedy, sampled), as configured."""
        return tuple(self.config.stop_threshold)

    @staticmethod
    def statistics(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """[..., 3]: log q(x), log max q and the entropy of q = softmax(logits [..., V]) (temperature 1), for the
        tokens x [...] drawn there."""
        log_q = logits.float().log_softmax(-1)
        entropy = -(log_q.exp() * log_q).sum(-1)
        return torch.stack([log_q.gather(-1, tokens[..., None])[..., 0], log_q.max(-1).values, entropy], -1)

    def forward(self, features: torch.Tensor, token_embeddings: torch.Tensor,
                statistics: torch.Tensor) -> torch.Tensor:
        """Acceptance logits [..., 2] (greedy, sampled) of tokens whose law the draft's `features` [..., d]
        produced, given their embeddings [..., d] and the law's `statistics` [..., 3] at them."""
        x = self.inputs(torch.cat([features, token_embeddings, statistics], -1))
        return self.out(self.blocks(x))

    def predict(self, features: torch.Tensor, token_embeddings: torch.Tensor, statistics: torch.Tensor,
                greedy: bool) -> torch.Tensor:
        """The predicted acceptance probability [..., 1] under greedy decoding or sampling (see `forward`)."""
        weight = self.inputs.weight
        logits = self(features.to(weight.dtype), token_embeddings.to(weight.dtype), statistics.to(weight.dtype))
        output = 0 if greedy else 1
        return logits[..., output : output + 1].sigmoid()
