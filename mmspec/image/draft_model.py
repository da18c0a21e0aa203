"""Draft-model speculative decoding for discrete image AR models: the step of `DraftModel(...)`, on the draft-model
algorithm every modality shares (`mmspec.core.drafting`).

A small AR model over the same image tokens (the drafter, another `DiscreteImageModel` adapter) drafts a chain of
`draft_length` tokens per row, sampling from its own processed law q (the same CFG / temperature / top-k / top-p as
the target); the target scores the chain in one forward and the core's chain verifier decides (Leviathan et al. 2023) with the
decoding's rule: exact (lossless) or LANTERN's relaxed acceptance (lossy; the setting the LANTERN papers use, there
with an EAGLE drafter).

One round for a row with c committed tokens and G = draft_length:
    drafter  feeds the committed tokens it has not cached ([x_{c-1}] in the first round, then [x_{c-2}, x_{c-1}]),
             then its own drafts; draws d_1 .. d_G with laws q_1 .. q_G                       (G batched forwards)
    target   [x_{c-1}, d_1, ..., d_G] -> p_c, ..., p_{c+G}                                     (one forward)
    verify   accept a prefix of n drafts, then the residual (or bonus) token: c += n + 1
Both caches then keep what is committed: the target up to x_{c-2} (x_{c-1} opens its next window), the drafter up to
x_{c-3}, so the two committed tokens it re-reads next round are always [x_{c-2}, x_{c-1}] — including when all G drafts
were accepted, where its cache lacks d_G. Every round draws the same number of uniforms per row and every window has
the same width, so a row's random stream does not depend on the rest of its batch.

Trees (`tree_width=K > 1`): the drafter grows the full tree of depth G with K children per node, drawn without
replacement from its law (`mmspec.core.tree_growth`; at temperature 0 its top K, deterministic), one batched
`forward_tree` per depth over the frontier, each level attending to its ancestors from the earlier levels; the
target scores [x_{c-1}, all nodes] in one `forward_tree` (tree mask, positions by depth) and the core's exact tree
walk (`mmspec.core.tree_verify`: RSD, or the deterministic-children rule) accepts a path and draws the closing
token. The target's cache keeps exactly the accepted path (`keep_path`, then the rollback). The drafter reads the
committed tokens it has not cached in a window of fixed width G + 1 (its catch-up forward; the row's root law is
at the row's last new token), rolls back to the committed tokens, then drafts; its tree slots are dropped after
drafting. Near the image's end a row's nodes stop at the last position a draft may take (its laws are zeroed past
it, so those children are not drawn: ragged trees). The drafter draws a fixed block of uniforms per level and the
walk a fixed block per round, so a row's random stream does not depend on the rest of its batch.
"""

from __future__ import annotations

import torch

from mmspec.core.drafting import ChainSpeculation, ModelProposer, TreeSpeculation
from mmspec.core.head_drafting import FeatureTap, HeadProposer
from mmspec.core.model import Logits
from mmspec.core.probs import SamplingConfig
from mmspec.core.rng import Generators
from mmspec.core.stats import SpecStats
from mmspec.image.loop import Commits, DecodeStep, Opening
from mmspec.image.protocol import DiscreteImageModel


class DraftStep:
    """One round of draft-model speculation for every row: the drafter proposes a chain (or its full tree), the
    target verifies it in one forward (`mmspec.core.drafting.ChainSpeculation` / `TreeSpeculation`), the rows commit,
    and the target rolls back to each row's new last token."""

    def __init__(self, decoding, model: DiscreteImageModel, opening: Opening, sampling: SamplingConfig,
                 generator: Generators, stats: SpecStats):
        self.model, self.opening, self.sampling, self.generator, self.stats = model, opening, sampling, generator, stats
        if decoding.tree:
            self.speculation = TreeSpeculation(decoding.tree_shape())
        else:
            self.speculation = ChainSpeculation(decoding.draft_length, opening.test)
        self.rows = Commits(opening, decoding.forward_width, stats)
        with opening.timer("draft"):
            self.proposer = self.open_proposer(decoding)
        stats.draft_forwards += 1

    def open_proposer(self, decoding) -> ModelProposer:
        """The drafter's proposer, its model prefilled with the condition (one draft forward)."""
        opening = self.opening
        state, _ = decoding.drafter.prefill(opening.condition, cfg=self.sampling.guidance_scale != 1.0,
                                            max_window=decoding.forward_width + decoding.draft_length + 1)
        return ModelProposer(decoding.drafter, state, opening.first_token.shape[0], opening.first_token.device)

    def progress(self) -> DecodeStep:
        return self.rows.progress()

    def finish(self) -> None:
        self.rows.finish()

    def target_law(self, logits: Logits, depth: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
        """The law [B, F, V] of the tokens at `depth` [B, F] after each row's last committed token (they hold
        position committed + depth)."""
        return self.opening.law(logits, self.rows.committed[:, None] + depth, sampling)

    def draft_law(self, logits: Logits, depth: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
        """`target_law`, zero where a draft would leave no position for the closing token: a tree near the image's
        end is ragged, a chain's drafts there are padding (they lie past its real drafts)."""
        inside = self.rows.committed[:, None] + depth <= self.opening.N - 2
        return self.target_law(logits, depth, sampling) * inside[..., None]

    def __call__(self) -> None:
        rows, timer, speculation, forwards = self.rows, self.opening.timer, self.speculation, self.proposer.forwards
        last = rows.seq.gather(1, rows.committed[:, None] - 1).squeeze(1)  # x_{c-1}
        with timer("draft"):
            draft = speculation.propose(self.proposer, rows.seq, rows.committed, self.draft_law, self.sampling,
                                        self.generator)
        self.stats.draft_forwards += self.proposer.forwards - forwards
        round = speculation.verify(self.model, self.opening.state, last, draft, self.target_law, self.sampling,
                                   self.generator, timer, limit=rows.draft_lengths(speculation.width))
        self.stats.target_forwards += 1
        if round.walk is not None:  # a tree's walks: the rates at which they accept each child rank, and more
            walk = round.walk
            self.stats.record_tree_walk(walk.node_acceptance, walk.node_alpha_star, walk.node_children,
                                        walk.accepted_rank, speculation.shape.branching, rows.active)
        with timer("verify"):
            rows.write(round.emitted[:, :-1], round.result, round.drafted)
        with timer("target"):
            self.model.rollback(self.opening.state, rows.committed - 1)  # x_{c-1} opens the target's next window


class HeadStep(DraftStep):
    """`DraftStep` with a feature head (`DraftHeads(...)`) in the draft model's place: the head reads the target's
    features (`mmspec.core.head_drafting.HeadProposer`), first the prefill's at the last condition slot, paired with
    image token 0."""

    def open_proposer(self, decoding) -> HeadProposer:
        opening, head = self.opening, decoding.head
        embedding, lm_head = self.model.feature_readout()
        head.bind(embedding, lm_head)
        tap = FeatureTap.of(lm_head, head.tapped_layers(self.model.feature_layers()))
        first = opening.first_token
        B, cfg = first.shape[0], self.sampling.guidance_scale != 1.0
        rows = 2 * B if cfg else B
        session = head.session(rows, self.rows.seq.shape[1] + decoding.forward_width + 2, B, cfg, first.device)
        proposer = HeadProposer(session, tap, B, first.device)
        proposer.prefill(session.rows(first[:, None]), tap.features[:, -1:],
                         torch.zeros(rows, 1, dtype=torch.long, device=first.device),
                         torch.ones(rows, 1, dtype=torch.bool, device=first.device))
        return proposer
