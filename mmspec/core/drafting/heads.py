"""Drafting with a head on the target's own features (EAGLE, Hydra: `mmspec.models.heads`), for every modality.

A head has no model of its own to run ahead: it reads the feature the target computed for each committed token (the
input of the target's LM head, and for an EAGLE-3 head the outputs of some of its decoder layers too, caught by a
`mmspec.adapters.features.FeatureTap`) and drafts from it. `HeadProposer` offers the draft-model proposer's two
calls (`chain`, `tree`; `mmspec.core.drafting.proposer.ModelProposer`), so the draft-model steps of text and images
verify its drafts unchanged.

A round for a row with c committed tokens (model-view indices, the row's last token at c - 1):
    catch up  the tokens committed since the last round (indices kept .. c - 1) are re-read with the features of the
              target's last forward, which scored [x_{kept-1}, drafts] (after a tree: its accepted path's nodes,
              found by their tokens), so drafted positions never keep the head's own guesses; the prediction at
              x_{c-1} gives the law of the first draft                                         (one head call)
    draft     one head call per depth: a chain, or a tree grown by `grow_tree` (EAGLE-2's dynamic trees, fixed
              trees), each token drawn from its processed law q, which the draft carries
The head's session (`mmspec.models.heads.HeadSession`) keeps its own state: the EAGLE layer's KV cache, Hydra's root
feature. Shapes: B samples, R cache rows (2B with classifier-free guidance), d the feature width, V the vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from mmspec.core.drafting import vocabulary
from mmspec.core.drafting.tree_growth import TreeLookup, grow_tree, shape_for
from mmspec.core.drafts import Draft
from mmspec.core.model import Logits
from mmspec.core.probs import SamplingConfig
from mmspec.core.rng import Generators, inverse_cdf, uniform
from mmspec.core.runtime.capture import kept_in_place
from mmspec.core.speculation import DraftLaw
from mmspec.core.tree_shape import TreeShape
from mmspec.core.trees import DraftTree


def check_draft_depth(head: Any, depth: int, argument: str, unit: str = "tokens") -> None:
    """Raise a `ValueError` naming `argument` when `head` cannot draft `depth` tokens a round, a chain's `tokens` or
    a tree's `levels` (a Hydra head drafts at most its number of heads; an EAGLE head any number)."""
    limit = getattr(head, "num_heads", None)
    if limit is not None and depth > limit:
        raise ValueError(f"{argument}: this Hydra head drafts at most {limit} {unit}, got {depth}")


class HeadProposer:
    """Drafts chains and trees with a head `session` (`mmspec.models.heads.HeadSession`) for B rows, from the
    features `tap` caught of the target's forwards. After `prefill`, each `chain` / `tree` call is one round."""

    def __init__(self, session: Any, tap: Any, batch_size: int, device: torch.device,
                 vocabulary: torch.Tensor | None = None, vocab_size: int | None = None):
        if (vocabulary is None) != (vocab_size is None):
            raise ValueError("a trimmed head needs both its vocabulary and the target's vocab_size")
        self.session, self.tap = session, tap
        # VocabTrim: the session's laws are over the ids `vocabulary` ([|S|]); chains widen each draw to the target's
        self.vocabulary, self.vocab_size = vocabulary, vocab_size
        self.kept = torch.ones(batch_size, dtype=torch.long, device=device)  # model-view tokens read with features
        self.forwards = 0  # head calls of the rounds so far (the stats' draft_forwards)
        # the last tree's (tokens, parent, real) [B, N] and depth: its accepted path's features are read next round
        self.last_tree: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.tree_depth = 0
        self.opening: Logits | None = None  # the prefill's law of the first draft, until the first round
        self.caught: torch.Tensor | None = None  # [R, W, w] the features of the target's last forward (`observe`)

    def prefill(self, tokens: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                valid: torch.Tensor) -> None:
        """The pairs (token, feature before it) up to the last committed token (model-view index 0, the last
        column): tokens [R, T], features [R, T, d], rotary positions [R, T], valid [R, T] bool (not counted in
        `forwards`, as a draft model's prefill is not)."""
        self.opening = self.session.prefill(tokens, features, positions, valid)

    def select(self, index: torch.Tensor) -> None:
        """Keep only rows `index` ([B'] long): finished rows left the batch."""
        if self.caught is not None:
            self.caught = self.caught[self.session.sample_rows(index)]
        self.session.select(index)
        self.kept = self.kept[index]
        if self.last_tree is not None:
            self.last_tree = tuple(x[index] for x in self.last_tree)

    def observe(self) -> None:
        """The target's forward of this round just ran: keep the features its tap caught, in place (a captured
        step's next iteration reads this tensor; the tap's own are the forward's outputs, which the next forward
        replaces)."""
        self.caught = kept_in_place(self.caught, self.tap.features)

    def _root(self, seq: torch.Tensor, committed: torch.Tensor) -> Logits:
        """Catch up with the tokens committed since the last round; the law after each row's last one [B, 1, V]."""
        if self.opening is not None:
            root, self.opening = self.opening, None
            return root
        features = self.caught
        if self.last_tree is not None:
            features = self._path_features(features, seq)
        W = features.shape[1]
        tokens = seq.gather(1, (self.kept[:, None] + torch.arange(W, device=seq.device)).clamp(max=seq.shape[1] - 1))
        self.forwards += 1
        root = self.session.catch_up(self.session.rows(tokens), features, self.kept, committed)
        self.kept.copy_(committed)
        return root

    def _path_features(self, features: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
        """features [R, N + 1, d] of a tree round's target forward ([x_{c-1}, nodes]) -> [R, D + 1, d]: the root's,
        then those of the accepted nodes (found by their committed tokens; siblings with equal tokens have equal
        features), the root's again past the path (those positions are not committed)."""
        (tokens, parents, real), B = self.last_tree, seq.shape[0]
        parent = torch.full((B,), -1, dtype=torch.long, device=seq.device)
        alive = torch.ones(B, dtype=torch.bool, device=seq.device)
        columns = [torch.zeros_like(parent)]
        for depth in range(self.tree_depth):
            token = seq.gather(1, (self.kept + depth).clamp(max=seq.shape[1] - 1)[:, None])
            match = real & (parents == parent[:, None]) & (tokens == token)
            alive = alive & match.any(-1)
            node = match.long().argmax(-1)
            columns.append(torch.where(alive, node + 1, 0))
            parent = torch.where(alive, node, -2)
        index = self.session.rows(torch.stack(columns, 1))
        return features.gather(1, index[..., None].expand(-1, -1, features.shape[-1]))

    def chain(self, seq: torch.Tensor, committed: torch.Tensor, length: int, law: DraftLaw,
              sampling: SamplingConfig, generator: Generators, budget: torch.Tensor | None = None) -> Draft:
        """`length` (G) draft tokens after each row's committed tokens seq[b, :committed[b]] (seq: [B, S] long,
        committed: [B] long), token i drawn from its law with the i-th of G uniforms per row; budget: [B] long,
        the drafts each row wants (default G; the draft's `lengths`)."""
        B, device = committed.shape[0], committed.device
        root = self._root(seq, committed)
        self.last_tree = None
        self.session.begin_round(committed, seq.shape[1])
        q = law(root, torch.zeros(B, 1, dtype=torch.long, device=device), sampling)  # [B, 1, V]
        draws = uniform((B, length), generator, device, q.dtype)
        token, q = self._drawn(q, draws[:, :1])
        tokens, laws = [token], [q]
        paths = torch.full((B, 1, length), -1, dtype=torch.long, device=device)
        for i in range(1, length):  # node i - 1 is the chain's i-th draft; its path is nodes 0 .. i - 1
            paths[:, :, i - 1] = i - 1
            self.forwards += 1
            logits = self.session.expand(torch.full((B, 1), i - 1, device=device), paths.clone(), torch.cat(tokens, 1),
                                         torch.ones(B, 1, dtype=torch.bool, device=device))
            token, q = self._drawn(law(logits, torch.full((B, 1), i, device=device), sampling), draws[:, i : i + 1])
            tokens.append(token)
            laws.append(q)
        self.session.end_round()
        lengths = torch.full((B,), length, dtype=torch.long, device=device) if budget is None else budget.clamp(
            max=length)
        return Draft(torch.cat(tokens, 1), lengths, torch.cat(laws, 1))

    def _drawn(self, q: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The draws [B, 1] from q [B, 1, V'] with uniforms u [B, 1], as the target's ids, and their law V wide."""
        tokens = inverse_cdf(q, u)
        if self.vocabulary is None:
            return tokens, q
        return vocabulary.widen(tokens, q, self.vocabulary, self.vocab_size)

    def tree(self, seq: torch.Tensor, committed: torch.Tensor, shape: TreeShape, law: DraftLaw,
             sampling: SamplingConfig, generator: Generators, lookup: TreeLookup | None = None) -> DraftTree:
        """A tree of `shape` after each row's committed tokens (seq, committed as in `chain`). At temperature 0 the
        children are the top tokens of the temperature-1 law (deterministic). lookup: a horizontal cascade, the
        levels past its `after` from its point masses (`grow_tree`)."""
        if self.vocabulary is not None:
            raise ValueError("a trimmed head drafts chains; its trees would draw children over the vocabulary's ids")
        B = committed.shape[0]
        root = self._root(seq, committed)
        self.session.begin_round(committed, seq.shape[1])
        law_sampling = dataclasses.replace(sampling, temperature=1.0) if sampling.greedy else sampling

        def expand(nodes, paths, node_tokens, valid):
            self.forwards += 1
            return law(self.session.expand(nodes, paths, node_tokens, valid), (paths >= 0).sum(-1), law_sampling)

        root_law = law(root, torch.zeros(B, 1, dtype=torch.long, device=seq.device), law_sampling)[:, 0]
        tree = grow_tree(root_law, expand, shape_for(shape, sampling), generator, lookup)
        self.session.end_round()
        kept = self.last_tree or (None, None, None)  # the next round reads them (a captured step's next iteration too)
        self.last_tree = tuple(map(kept_in_place, kept, (tree.tokens, tree.parent, tree.real)))
        self.tree_depth = shape.depth
        return tree
