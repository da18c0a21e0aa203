"""Draft-model speculative decoding for discrete image AR models.

A small AR model over the same image tokens (the drafter, another `DiscreteImageModel` adapter) drafts a chain of
`draft_length` tokens per row, sampling from its own processed law q (the same CFG / temperature / top-k / top-p as
the target); the target scores the chain in one forward and the core's chain verifier decides (Leviathan et al. 2023):
`verify_exact` (lossless) or `verify_lantern` (LANTERN relaxed acceptance, lossy; the setting the LANTERN papers
use, there with an EAGLE drafter).

One round for a row with c committed tokens and G = draft_length:
    drafter  feeds the committed tokens it has not cached ([x_{c-1}] in the first round, then [x_{c-2}, x_{c-1}]),
             then its own drafts; draws d_1 .. d_G with laws q_1 .. q_G                       (G batched forwards)
    target   [x_{c-1}, d_1, ..., d_G] -> p_c, ..., p_{c+G}                                     (one forward)
    verify   accept a prefix of n drafts, then the residual (or bonus) token: c += n + 1
Both caches then keep what is committed: the target up to x_{c-2} (x_{c-1} opens its next window), the drafter up to
x_{c-3}, so the two committed tokens it re-reads next round are always [x_{c-2}, x_{c-1}] — including when all G drafts
were accepted, where its cache lacks d_G. Every round draws the same number of uniforms per row and every window has
the same width, so a row's random stream does not depend on the rest of its batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from mmspec.core.acceptance import Acceptance, Exact
from mmspec.core.component import RUNTIME, DecodingComponent
from mmspec.core.drafts import Draft
from mmspec.core.probs import SamplingConfig
from mmspec.core.rng import Generators, inverse_cdf, uniform
from mmspec.core.stats import SpecStats
from mmspec.core.verify import verify
from mmspec.image.decoding import Commits, image_span, open_decoding, probs_of
from mmspec.image.lantern import relaxation_for
from mmspec.image.protocol import DiscreteImageModel


@dataclass(frozen=True)
class DraftModel(DecodingComponent):
    """Speculative decoding with a draft image model, batched, with per-row acceptance.

    draft_length: G, tokens drafted per round (the target scores G + 1 positions per forward). acceptance: `Exact()`
    (lossless) or `Lantern(k, delta, lam)` (relaxed, lossy), or its name. drafter: the draft model's adapter (same
    grid and image vocabulary as the target); pipelines supply their own, so it is not saved.
    """

    name: ClassVar[str] = "draft"
    modality: ClassVar[str] = "image"
    draft_length: int = 4
    acceptance: Acceptance = Exact()
    drafter: DiscreteImageModel | None = field(default=None, repr=False, compare=False, metadata=RUNTIME)

    def __post_init__(self):
        self.check_count("draft_length", "tokens drafted per target forward")
        super().__post_init__()

    @torch.no_grad()
    def __call__(
        self, model: DiscreteImageModel, condition, sampling: SamplingConfig, generator: Generators, stats: SpecStats
    ):
        drafter = self._check_drafter(model)
        G = self.draft_length
        W = G + 1
        relaxation = relaxation_for(self.acceptance, model, image_span(model)[1], sampling)  # checked before prefill
        opening = open_decoding(model, condition, sampling, generator, stats, max_window=W)
        N, forced, state, timer = opening.N, opening.forced, opening.state, opening.timer
        with timer("draft"):
            draft_state, _ = drafter.prefill(condition, cfg=sampling.guidance_scale != 1.0, max_window=W)
        stats.draft_forwards += 1
        B, device = opening.first_token.shape[0], opening.first_token.device
        window = torch.arange(W, device=device)
        rows = Commits(opening.first_token, N, W, stats)
        try:
            yield rows.progress()
            while rows.minimum < N:
                committed, active = rows.committed, rows.active
                positions = committed[:, None] + window  # [B, W] absolute positions the target predicts
                with timer("draft"):
                    draws = uniform((B, G), generator, device, opening.dtype)
                    context = 1 if rows.step == 0 else 2
                    tokens = rows.seq.gather(1, committed[:, None] - context + torch.arange(context, device=device))
                    drafts, laws = [], []
                    for i in range(G):  # one batched forward per draft position (the drafter is autoregressive)
                        q = probs_of(drafter.forward(tokens, draft_state).at(slice(-1, None)), sampling,
                                     positions[:, i : i + 1], forced)  # [B, 1, V]
                        tokens = inverse_cdf(q, draws[:, i : i + 1])  # [B, 1]
                        drafts.append(tokens)
                        laws.append(q)
                    drafts, laws = torch.cat(drafts, 1), torch.cat(laws, 1)  # [B, G], [B, G, V]
                stats.draft_forwards += G
                with timer("target"):
                    last = rows.seq.gather(1, committed[:, None] - 1)
                    logits = model.forward(torch.cat([last, drafts], 1), state)
                stats.target_forwards += 1
                with timer("verify"):
                    p = probs_of(logits, sampling, positions, forced)  # [B, W, V]
                    lengths = rows.draft_lengths(W)
                    chain = Draft(drafts, lengths, laws)
                    result = verify(p, chain, generator, self.acceptance, relaxation=relaxation)
                    n = result.n_accepted[:, None]
                    run = torch.where(window[:-1] < n, drafts, result.next_token[:, None])  # [B, G]
                    run = torch.cat([run, result.next_token[:, None]], 1)  # [B, W]; j <= n is what commits
                    write = active[:, None] & (window <= n)
                    rows.seq.scatter_(1, positions, torch.where(write, run, rows.seq.gather(1, positions)))
                    rows.advance(result, lengths)
                with timer("target"):
                    model.rollback(state, rows.committed - 1)  # x_{c-1} opens the target's next window
                with timer("draft"):
                    drafter.rollback(draft_state, rows.committed - 2)  # the drafter re-reads [x_{c-2}, x_{c-1}]
                yield rows.progress()
        finally:  # also when the caller stops early: count what was committed
            rows.finish(opening.started)

    def _check_drafter(self, model: DiscreteImageModel) -> DiscreteImageModel:
        if self.drafter is None:
            raise ValueError(
                "decoding='draft' needs a draft model: load a pipeline that has a draft_transformer, or pass "
                "drafter=<adapter> to DraftModel"
            )
        if (self.drafter.grid, self.drafter.vocab_size) != (model.grid, model.vocab_size):
            raise ValueError(
                f"the drafter must share the target's image tokens: drafter grid {self.drafter.grid}, vocab_size "
                f"{self.drafter.vocab_size}; target grid {model.grid}, vocab_size {model.vocab_size}"
            )
        return self.drafter
