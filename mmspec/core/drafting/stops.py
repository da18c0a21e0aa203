"""When a row stops drafting (a draft model's chain, `mmspec.core.drafting.proposer.ModelProposer.chain`): after each
drafted token the stop rule says, per row, whether that token is the row's last this round. A rule reads only the
drafter's side (its laws, tokens and features), so it changes what is proposed, never the law of what is kept: every
rule is exact. The chain is drafted to its full length whatever the rule says, and each row's length masks what it
cut: a fixed-shape step, with no host read, that a CUDA graph can hold.

`ConfidenceStop`: stop after a token whose draft probability is below a threshold (HF's
`assistant_confidence_threshold`). `LearnedStop` (SpecDec++, Huang et al. 2024): an acceptance head on the drafter's
features predicts, for each drafted token, the probability that the target accepts it; a row stops once the
predicted probability that some token of its draft so far is rejected, 1 - prod(a_i), exceeds a threshold.
"""

from __future__ import annotations

import torch

from mmspec.core.model import Logits
from mmspec.core.probs import SamplingConfig
from mmspec.core.runtime.capture import weights_of


class DraftStop:
    """Base of the stop rules: `start(batch_size, device)` opens a round; `__call__(i, logits, q, token, sampling)`
    after draft token i (0-based) of every row: logits [B, 1, V] the draft model's, q [B, 1, V] the processed law
    the token [B, 1] was drawn from; returns [B] bool, the rows whose draft ends with this token. `capture_key()`:
    what makes two rules' rounds replayable by the same captured graphs."""

    def start(self, batch_size: int, device: torch.device) -> None:
        pass

    def capture_key(self) -> tuple:
        raise NotImplementedError

    def __call__(self, i: int, logits: Logits, q: torch.Tensor, token: torch.Tensor,
                 sampling: SamplingConfig) -> torch.Tensor:
        raise NotImplementedError


class ConfidenceStop(DraftStop):
    """Stop after a token whose draft probability is below `threshold` (in (0, 1))."""

    def __init__(self, threshold: float):
        if not 0 < threshold < 1:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}")
        self.threshold = threshold

    def capture_key(self) -> tuple:
        return type(self), self.threshold

    def __call__(self, i, logits, q, token, sampling):
        return q[:, 0].gather(1, token).squeeze(1) < self.threshold


class LearnedStop(DraftStop):
    """SpecDec++'s stop: `head` (an `mmspec.models.acceptance.AcceptanceHead`) predicts each drafted token's
    acceptance from the draft model's feature that produced its law (`feature()`: [B, 1, d], the input of the
    draft's LM head in the forward that gave `logits`), the token's embedding (`embed`: the draft's input
    embedding) and statistics of the draft's temperature-1 law there (`AcceptanceHead.statistics`); a row stops
    once 1 - prod(a_i) > `threshold`. Greedy decoding reads the head's greedy output (does the target's argmax equal
    the draft's?), sampling its sampled one (min(1, p/q)); threshold None: the head's own for the mode
    (`AcceptanceHead.stop_threshold`: greedy, sampled)."""

    def __init__(self, head, feature, embed: torch.nn.Module, threshold: float | None = None):
        if threshold is not None and not 0 < threshold < 1:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}")
        self.head, self.feature, self.embed, self.threshold = head, feature, embed, threshold
        self.kept: torch.Tensor | None = None  # [B] predicted probability that every draft so far is accepted

    def capture_key(self) -> tuple:
        return type(self), weights_of(self.head), self.threshold

    def start(self, batch_size, device):
        self.kept = torch.ones(batch_size, device=device)

    def __call__(self, i, logits, q, token, sampling):
        statistics = self.head.statistics(logits.cond[:, -1:], token)  # [B, 1, 3]
        accepted = self.head.predict(self.feature()[:, -1:], self.embed(token), statistics,
                                     greedy=sampling.greedy)  # [B, 1, 1]
        self.kept = self.kept * accepted[:, 0, 0].float()
        threshold = self.head.stop_threshold[0 if sampling.greedy else 1] if self.threshold is None else self.threshold
        return 1 - self.kept > threshold
