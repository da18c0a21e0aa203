"""A draft model's chains and trees: the draft-model algorithm, once, for every modality (text: a draft LM or the
target's early exit; images: a draft GPT over the same codes). The round that verifies them is
`mmspec.core.speculation`.

`ModelProposer` drafts with a `CausalModel` over the target's tokens, sampling from its own processed law q, which
every draft carries (`Draft.q`, `DraftTree.q`). Chains (Leviathan et al. 2023): one batched forward per draft
position. Trees: `grow_tree` (EAGLE-2's dynamic trees, OPT-Tree's reranking, Sequoia's fixed trees) with one
`forward_tree` per depth over the frontier, each level attending to its ancestors; the tree's slots leave the
drafter's cache afterwards.

Its cache follows the committed tokens without a host read. A chain round feeds the committed tokens it lacks in a
window of fixed width: the last one on the first round, then always the last two, [x_{c-2}, x_{c-1}] (its cache is
rolled back to c - 2, which covers the round where every draft was accepted and d_G was never fed). A tree round
feeds, in a window of depth + 1, the committed tokens since its previous round (at most the accepted path and the
closing token) and reads the root's law at the row's last one.

Laws come from the caller (`DraftLaw`): the processed law of the token at `depth` after the row's last committed
token, which for an image model also fixes forced structure tokens. A round draws a fixed number of uniforms per row,
so with per-row generators a row's random stream does not depend on the rest of its batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from mmspec.core.drafting import vocabulary
from mmspec.core.drafting.stops import DraftStop
from mmspec.core.drafting.tree_growth import TreeLookup, grow_tree, shape_for, visible_slots
from mmspec.core.drafts import Draft
from mmspec.core.model import CausalModel
from mmspec.core.probs import SamplingConfig
from mmspec.core.rng import Generators, inverse_cdf, uniform
from mmspec.core.speculation import DraftLaw
from mmspec.core.tree_shape import TreeShape
from mmspec.core.trees import DraftTree

# lookup(drafts [B, G], have [B], width) -> (tokens [B, width], available [B]): a cheaper drafter's continuation
Lookup = Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


class ModelProposer:
    """Drafts chains and trees with `model` (its state after the prompt's prefill, `state`) for B rows. vocabulary:
    chains only, the ids S a trimmed model's |S| logits stand for (`mmspec.core.drafting.vocabulary`), of
    `vocab_size`."""

    def __init__(self, model: CausalModel, state: Any, batch_size: int, device: torch.device,
                 vocabulary: torch.Tensor | None = None, vocab_size: int | None = None):
        if (vocabulary is None) != (vocab_size is None):
            raise ValueError("a trimmed draft needs both its vocabulary and the target's vocab_size")
        self.model, self.state = model, state
        self.vocabulary, self.vocab_size = vocabulary, vocab_size
        self.kept = torch.zeros(batch_size, dtype=torch.long, device=device)  # committed tokens cached (trees)
        self.rounds = 0
        self.forwards = 0  # model calls so far (the stats' draft_forwards)

    def select(self, index: torch.Tensor) -> None:
        """Keep only rows `index` ([B'] long): finished rows left the batch."""
        self.model.select_rows(self.state, index)
        self.kept = self.kept[index]

    def observe(self) -> None:
        """The target's forward of this round ran: a draft model reads nothing of it."""

    def _opening(self, seq: torch.Tensor, committed: torch.Tensor) -> torch.Tensor:
        """A chain round's first window [B, C]: the committed tokens the draft cache lacks, rolled back to c - 2 —
        the last one on the first round (C = 1), then always the last two (C = 2; see the module docstring)."""
        context = 1 if self.rounds == 0 else 2
        if self.rounds:
            self.model.rollback(self.state, committed - 2)
        self.rounds += 1
        return seq.gather(1, committed[:, None] - context + torch.arange(context, device=committed.device))

    def chain(self, seq: torch.Tensor, committed: torch.Tensor, length: int, law: DraftLaw,
              sampling: SamplingConfig, generator: Generators, budget: torch.Tensor | None = None,
              stop: DraftStop | None = None) -> Draft:
        """`length` (G) draft tokens after each row's committed tokens seq[b, :committed[b]] (seq: [B, S] long,
        committed: [B] long), token i drawn from its law with the i-th of G uniforms per row (drawn once the first
        law is known, in its dtype); budget: [B] long, the drafts each row wants (default G; the draft's
        `lengths`). stop: after each token, which rows draft no more this round (`mmspec.core.drafting.stops`): the
        chain is drafted to its full length all the same, and each row's length masks what the rule cut (a fixed
        shape, no host read)."""
        B, device = committed.shape[0], committed.device
        tokens = self._opening(seq, committed)
        drafts, laws, draws = [], [], None
        stop_at = torch.full((B,), length, dtype=torch.long, device=device) if budget is None else budget.clone()
        if stop is not None:
            stop.start(B, device)
        for i in range(length):  # one batched forward per draft position (the drafter is autoregressive)
            self.forwards += 1
            logits = self.model.forward(tokens, self.state).at(slice(-1, None))
            q = law(logits, torch.full((B, 1), i, device=device), sampling)  # [B, 1, V]
            if draws is None:
                draws = uniform((B, length), generator, device, q.dtype)
            tokens = inverse_cdf(q, draws[:, i : i + 1])  # [B, 1]
            if self.vocabulary is not None:  # indices into S, a law over S
                tokens, q = vocabulary.widen(tokens, q, self.vocabulary, self.vocab_size)
            drafts.append(tokens)
            laws.append(q)
            if stop is not None and i < length - 1:
                stop_at = stop_after(stop_at, stop(i, logits, q, tokens, sampling), i)
        return Draft(torch.cat(drafts, 1), stop_at, torch.cat(laws, 1))

    def cascade(self, seq: torch.Tensor, committed: torch.Tensor, length: int, law: DraftLaw,
                sampling: SamplingConfig, generator: Generators, lookup: Lookup,
                budget: torch.Tensor | None = None, forwards: int | None = None) -> Draft:
        """The chain `chain` draws (token i from its law with the i-th of G uniforms per row, the same tokens and
        laws), as far in fewer forwards: a vertical cascade (CS-Drafting, Chen et al. 2023) with a cheaper
        deterministic drafter under the model. Each forward scores the row's last draft and `lookup`'s continuation
        of it; a looked-up token is kept while it equals what the model's draw at its position gives (drawing from q
        and keeping a deterministic proposal only when the draw equals it is exact, and here draws nothing extra),
        and the first draw that differs is kept too, so each forward adds at least one token per row.

        lookup(drafts [B, G] long, have [B] long, width) -> (tokens [B, width] long, available [B] long): up to
        `width` tokens continuing each row's committed tokens and its first have[b] drafts. The round runs
        `forwards` forwards (None: G, and every row has its G tokens), each scoring G - 1 looked-up tokens (those
        past a row's `available` are never kept): fixed shapes, no host read. With fewer than G, a row's draft ends
        where its forwards reached: at least `forwards` tokens, more where the lookup's continuations held."""
        B, device = committed.shape[0], committed.device
        width = length - 1  # looked-up tokens scored per forward: the draws of the last G - 1 positions
        fed = self._opening(seq, committed)  # [B, C]
        cached = committed - fed.shape[1]  # each row's draft-cache length before the forward
        have = torch.zeros(B, dtype=torch.long, device=device)  # drafts so far per row
        offsets = torch.arange(width + 1, device=device)
        drafts = torch.zeros(B, length + width + 1, dtype=torch.long, device=device)
        laws = draws = None
        for _ in range(length if forwards is None else forwards):
            proposal, available = lookup(drafts[:, :length], have, width)
            self.forwards += 1
            scored = fed.shape[1]
            logits = self.model.forward(torch.cat([fed, proposal], 1), self.state).at(slice(scored - 1, None))
            position = have[:, None] + offsets  # [B, G] the draft index of each scored law
            q = law(logits, position, sampling)  # [B, G, V]
            if draws is None:
                draws = uniform((B, length), generator, device, q.dtype)
                laws = q.new_zeros(B, length + width + 1, q.shape[-1])
            tokens, kept = keep_lookup(q, draws.gather(1, position.clamp(max=length - 1)), proposal, available)
            # written past each row's new drafts too: the next forward overwrites them, or they lie past G
            drafts.scatter_(1, position, tokens)
            laws.scatter_(1, position[..., None].expand_as(q), q)
            new = torch.minimum(kept + 1, length - have)
            fed = tokens.gather(1, (new - 1).clamp(min=0)[:, None])
            # the fed tokens and the looked-up ones the draws kept (a row that has its G tokens keeps its cache: the
            # forwards after it write at most G slots past it, which `CascadeDrafter` sizes its cache for)
            cached = cached + torch.where(new > 0, scored + kept, 0)
            self.model.rollback(self.state, cached)
            have = have + new
        return Draft(drafts[:, :length], have if budget is None else torch.minimum(have, budget), laws[:, :length])

    def tree(self, seq: torch.Tensor, committed: torch.Tensor, shape: TreeShape, law: DraftLaw,
             sampling: SamplingConfig, generator: Generators, lookup: TreeLookup | None = None) -> DraftTree:
        """A tree of `shape` after each row's committed tokens (seq, committed as in `chain`). At temperature 0 the
        children are the top tokens of the temperature-1 law (deterministic). lookup: a horizontal cascade, the
        levels past its `after` from its point masses (`grow_tree`)."""
        B = committed.shape[0]
        width = shape.depth + 1  # the committed tokens since the last round: at most its path and closing token
        window = seq.gather(1, self.kept[:, None] + torch.arange(width, device=seq.device))
        self.forwards += 1
        logits = self.model.forward(window, self.state)
        root = logits.gather((committed - self.kept - 1).clamp(min=0)[:, None])  # [B, 1, V] at x_{c-1}
        self.model.rollback(self.state, committed)
        law_sampling = dataclasses.replace(sampling, temperature=1.0) if sampling.greedy else sampling
        fed = torch.zeros(B, 0, dtype=torch.long, device=seq.device)

        def expand(nodes, paths, node_tokens, valid):
            nonlocal fed
            depth = (paths >= 0).sum(-1)  # [B, F]; a node of depth d is token d after the root
            self.forwards += 1
            logits = self.model.forward_tree(node_tokens.gather(1, nodes), depth - 1, visible_slots(fed, paths, nodes),
                                             self.state)
            fed = torch.cat([fed, nodes], 1)
            return law(logits, depth, law_sampling)

        root_law = law(root, torch.zeros(B, 1, dtype=torch.long, device=seq.device), law_sampling)[:, 0]
        tree = grow_tree(root_law, expand, shape_for(shape, sampling), generator, lookup)
        self.model.rollback(self.state, committed)  # the tree's slots leave the drafter's cache
        self.kept.copy_(committed)  # in place: a captured step replays this
        return tree


def stop_after(stop_at: torch.Tensor, stopped: torch.Tensor, i: int) -> torch.Tensor:
    """Each row's draft length [B] once the rows `stopped` ([B] bool) end their draft with token i (0-based): the
    token that tripped the stop stays in the draft, as drawn from its law (dropping it would keep only tokens the
    rule liked, a law the draft no longer records)."""
    return torch.where(stopped & (stop_at > i + 1), i + 1, stop_at)


def keep_lookup(q: torch.Tensor, draws: torch.Tensor, proposal: torch.Tensor,
                available: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A cascade's middle level (`ModelProposer.cascade`): the model's draws at the scored positions and how many
    looked-up tokens they keep. q: [B, W + 1, V], the laws after the fed token and after each looked-up token;
    draws: [B, W + 1] uniforms; proposal: [B, W] long, the looked-up tokens, of which available [B] are real.
    Returns (tokens [B, W + 1] long, token j drawn from q[:, j]; kept [B] long, the leading looked-up tokens equal
    to their draw)."""
    tokens = inverse_cdf(q, draws)
    W = proposal.shape[1]
    agree = (proposal == tokens[:, :W]) & (torch.arange(W, device=q.device) < available[:, None])
    return tokens, agree.long().cumprod(1).sum(1)
