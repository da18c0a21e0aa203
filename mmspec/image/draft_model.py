"""Draft-model speculative decoding for discrete image AR models: the step of `DraftModel(...)` and `DraftHeads(...)`,
the round every modality shares (`mmspec.core.speculation`) on the draft-model algorithm
(`mmspec.core.drafting.proposer`) or the feature heads' (`mmspec.core.drafting.heads`).

A small AR model over the same image tokens (the drafter, another `DiscreteImageModel` adapter) drafts a chain of
`draft_length` tokens per row, sampling from its own processed law q (the same CFG / temperature / top-k / top-p as
the target); the target scores the chain in one forward and the core's chain verifier decides (Leviathan et al.
2023) with the decoding's rule: exact (lossless) or LANTERN's relaxed acceptance (lossy; the setting the LANTERN
papers use, there with an EAGLE drafter).

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
replacement from its law (`mmspec.core.drafting.tree_growth`; at temperature 0 its top K, deterministic), one batched
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

from mmspec.adapters.features import bind_head
from mmspec.core.drafting.heads import HeadProposer
from mmspec.core.drafting.lengths import DraftLengthSchedule
from mmspec.core.drafting.proposer import ModelProposer
from mmspec.core.drafts import Draft
from mmspec.core.model import Logits
from mmspec.core.probs import SamplingConfig
from mmspec.core.rng import Generators
from mmspec.core.speculation import Chain, SpeculativeStep, Tree
from mmspec.core.stats import SpecStats
from mmspec.core.trees import DraftTree
from mmspec.image.loop import Commits, Opening
from mmspec.image.protocol import DiscreteImageModel


def draft_step(decoding, model: DiscreteImageModel, opening: Opening, sampling: SamplingConfig,
               generator: Generators, stats: SpecStats, heads: bool = False) -> SpeculativeStep:
    """The round of `decoding` (`DraftModel`, or `DraftHeads` with `heads`) for every row: its drafter (the draft
    model, or the feature head in its place) opened on the condition (one draft forward), chains or trees
    (`decoding.tree`)."""
    rows = Commits(opening, decoding.forward_width, stats)
    with opening.timer("draft"):
        if heads:
            proposer = open_head(decoding, model, opening, rows, sampling)
        else:
            proposer = open_drafter(decoding, opening, sampling)
    stats.draft_forwards += 1
    target_law, draft_law = ImageLaw(opening, rows), ImageLaw(opening, rows, inside=True)
    if decoding.tree:
        strategy = Tree(ProposedTrees(proposer, draft_law, decoding.tree_shape()), target_law)
    else:
        strategy = Chain(ProposedChains(proposer, draft_law), DraftLengthSchedule(decoding.draft_length), opening.test,
                         target_law)
    strategy.start(rows.seq.shape[0], rows.seq.device)
    return SpeculativeStep(strategy, model, opening.state, rows, sampling, generator, stats, opening.timer)


def open_drafter(decoding, opening: Opening, sampling: SamplingConfig) -> ModelProposer:
    """The draft model's proposer, its model prefilled with the condition."""
    state, _ = decoding.drafter.prefill(opening.condition, cfg=sampling.guidance_scale != 1.0,
                                        max_window=decoding.forward_width + decoding.draft_length + 1)
    return ModelProposer(decoding.drafter, state, opening.first_token.shape[0], opening.first_token.device)


def open_head(decoding, model: DiscreteImageModel, opening: Opening, rows: Commits,
              sampling: SamplingConfig) -> HeadProposer:
    """A feature head (`DraftHeads(...)`) in the draft model's place: it reads the target's features
    (`mmspec.core.drafting.heads.HeadProposer`), first the prefill's at the last condition slot, paired with image
    token 0."""
    head = decoding.head
    tap = bind_head(head, model)
    first = opening.first_token
    B, cfg = first.shape[0], sampling.guidance_scale != 1.0
    batch = 2 * B if cfg else B
    session = head.session(batch, rows.seq.shape[1] + decoding.forward_width + 2, B, cfg, first.device)
    proposer = HeadProposer(session, tap, B, first.device)
    proposer.prefill(session.rows(first[:, None]), tap.features[:, -1:],
                     torch.zeros(batch, 1, dtype=torch.long, device=first.device),
                     torch.ones(batch, 1, dtype=torch.bool, device=first.device))
    return proposer


class ImageLaw:
    """The law [B, F, V] of the image tokens at `depth` [B, F] after each row's last committed token (they hold position
    committed + depth), forced tokens fixed (`mmspec.core.speculation.DraftLaw`). inside: a drafter's law, zero
    where a draft would leave no position for the closing token (a tree near the image's end is ragged, a chain's drafts
    there lie past the row's room)."""

    def __init__(self, opening: Opening, rows: Commits, inside: bool = False):
        self.opening, self.rows, self.inside = opening, rows, inside

    def __call__(self, logits: Logits, depth: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
        positions = self.rows.committed[:, None] + depth
        law = self.opening.law(logits, positions, sampling)
        return law * (positions <= self.opening.N - 2)[..., None] if self.inside else law


class Proposed:
    """A proposer (a draft model's or a head's) drafting under `law` as the round's drafter: its model calls and the
    rows it follows."""

    capturable = True

    def __init__(self, proposer: ModelProposer | HeadProposer, law: ImageLaw):
        self.proposer, self.law = proposer, law

    @property
    def forwards(self) -> int:
        return self.proposer.forwards

    def select(self, index: torch.Tensor) -> None:
        self.proposer.select(index)

    def observe(self, rows: Commits, laws: torch.Tensor | None) -> None:
        self.proposer.observe()


class ProposedChains(Proposed):
    """A proposer's chains (`mmspec.core.speculation.ChainDrafts`)."""

    def propose(self, rows: Commits, budget: torch.Tensor, width: int, sampling: SamplingConfig,
                generator: Generators) -> Draft:
        return self.proposer.chain(rows.seq, rows.committed, width, self.law, sampling, generator, budget)


class ProposedTrees(Proposed):
    """A proposer's trees of `shape` (`mmspec.core.speculation.TreeDrafts`)."""

    def __init__(self, proposer: ModelProposer | HeadProposer, law: ImageLaw, shape):
        super().__init__(proposer, law)
        self.shape = shape

    def propose(self, rows: Commits, sampling: SamplingConfig, generator: Generators) -> DraftTree:
        return self.proposer.tree(rows.seq, rows.committed, self.shape, self.law, sampling, generator)
