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

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from mmspec.core.acceptance import Acceptance, Exact
from mmspec.core.component import RUNTIME, DecodingComponent
from mmspec.core.drafts import Draft
from mmspec.core.probs import SamplingConfig
from mmspec.core.rng import Generators, inverse_cdf, uniform
from mmspec.core.stats import SpecStats
from mmspec.core.tree_growth import TreeShape, grow_tree, shape_for, visible_slots
from mmspec.core.tree_verify import verify_tree
from mmspec.core.verify import VerifyResult, verify
from mmspec.image.decoding import Commits, Opening, image_span, open_decoding, probs_of
from mmspec.image.lantern import relaxation_for
from mmspec.image.protocol import TREE_METHODS, DiscreteImageModel, ImageLogits, require_methods


@dataclass(frozen=True)
class DraftModel(DecodingComponent):
    """Speculative decoding with a draft image model, batched, with per-row acceptance.

    draft_length: G, tokens drafted per round along a chain, or the depth of a tree (the target scores G + 1
    positions of a chain per forward). acceptance: `Exact()` (lossless) or `Lantern(k, delta, lam)` (relaxed, lossy;
    chains only), or its name. tree_width: K, children per tree node; 1 = chains, K > 1 = the drafter's full tree
    (K + K^2 + ... + K^G nodes, scored in one target forward; exact acceptance only). drafter: the draft model's
    adapter (same grid and image vocabulary as the target); pipelines supply their own, so it is not saved.
    """

    name: ClassVar[str] = "draft"
    modality: ClassVar[str] = "image"
    draft_length: int = 4
    acceptance: Acceptance = Exact()
    tree_width: int = 1
    drafter: DiscreteImageModel | None = field(default=None, repr=False, compare=False, metadata=RUNTIME)

    def __post_init__(self):
        self.check_count("draft_length", "tokens drafted per target forward")
        self.check_count("tree_width", "children per tree node; 1 = a chain")
        super().__post_init__()
        if self.tree and not isinstance(self.acceptance, Exact):
            raise ValueError(f"tree_width > 1 (draft trees) is verified by exact tree rules; acceptance must be "
                             f"Exact(), got {self.acceptance!r}")

    @property
    def tree(self) -> TreeShape | None:
        """The drafter's tree shape, or None for chains."""
        return None if self.tree_width == 1 else TreeShape.full(self.draft_length, self.tree_width)

    @property
    def forward_width(self) -> int:
        """Tokens one target forward scores per row: the last committed token and the chain's or tree's drafts."""
        return 1 + (self.draft_length if self.tree is None else self.tree.nodes)

    @torch.no_grad()
    def __call__(
        self, model: DiscreteImageModel, condition, sampling: SamplingConfig, generator: Generators, stats: SpecStats
    ):
        drafter = self._check_drafter(model)
        tree, W = self.tree, self.forward_width
        relaxation = relaxation_for(self.acceptance, model, image_span(model)[1], sampling)  # checked before prefill
        opening = open_decoding(model, condition, sampling, generator, stats, max_window=W)
        with opening.timer("draft"):
            draft_state, _ = drafter.prefill(condition, cfg=sampling.guidance_scale != 1.0,
                                             max_window=W + self.draft_length + 1)
        stats.draft_forwards += 1
        rows = Commits(opening.first_token, opening.N, W, stats)
        draft_kept = torch.zeros_like(rows.committed)  # committed tokens in the drafter's cache (trees)
        try:
            yield rows.progress()
            while rows.minimum < opening.N:
                if tree is None:
                    self._chain_round(model, drafter, opening, draft_state, rows, sampling, generator, relaxation)
                else:
                    draft_kept = self._tree_round(model, drafter, opening, draft_state, draft_kept, rows, sampling,
                                                  generator)
                yield rows.progress()
        finally:  # also when the caller stops early: count what was committed
            rows.finish(opening.started)

    def _chain_round(self, model, drafter, opening: Opening, draft_state, rows: Commits, sampling, generator,
                     relaxation) -> None:
        """Draft G tokens per row, score them in one target forward, verify the chain, commit, roll back."""
        G, forced, state, timer, stats = self.draft_length, opening.forced, opening.state, opening.timer, rows.stats
        W = G + 1
        committed = rows.committed
        B, device = committed.shape[0], committed.device
        window = torch.arange(W, device=device)
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
            result = verify(p, Draft(drafts, lengths, laws), generator, self.acceptance, relaxation=relaxation)
            self._commit(rows, drafts, result, lengths)
        with timer("target"):
            model.rollback(state, rows.committed - 1)  # x_{c-1} opens the target's next window
        with timer("draft"):
            drafter.rollback(draft_state, rows.committed - 2)  # the drafter re-reads [x_{c-2}, x_{c-1}]

    def _tree_round(self, model, drafter, opening: Opening, draft_state, draft_kept: torch.Tensor, rows: Commits,
                    sampling, generator) -> torch.Tensor:
        """Draft a tree per row, score [x_{c-1}, nodes] in one target forward, walk it, commit, keep the path.
        Returns the committed tokens now in the drafter's cache."""
        G, N, forced, state, timer, stats = (self.draft_length, opening.N, opening.forced, opening.state,
                                             opening.timer, rows.stats)
        shape = shape_for(self.tree, sampling)
        law_sampling = dataclasses.replace(sampling, temperature=1.0) if sampling.greedy else sampling
        committed = rows.committed
        device = committed.device

        def law(logits: ImageLogits, depth: torch.Tensor) -> torch.Tensor:
            """The law [B, F, V] of the children of nodes at `depth` [B, F] (they hold position c + depth), zero
            where a child would leave no position for the closing token."""
            q = probs_of(logits, law_sampling, committed[:, None] + depth, forced)
            return q * (committed[:, None] + depth <= N - 2)[..., None]

        with timer("draft"):
            catch_up = draft_kept[:, None] + torch.arange(G + 1, device=device)  # the tokens it has not read, and more
            logits = drafter.forward(rows.seq.gather(1, catch_up), draft_state)
            at = (committed - draft_kept - 1).clamp(min=0)[:, None, None]  # where x_{c-1} sits in that window
            root = ImageLogits(*(None if x is None else x.gather(1, at.expand(-1, -1, x.shape[-1]))
                                 for x in (logits.cond, logits.uncond)))  # [B, 1, V]
            drafter.rollback(draft_state, committed)
            fed = torch.zeros(committed.shape[0], 0, dtype=torch.long, device=device)

            def expand(nodes, paths, node_tokens, valid):
                nonlocal fed
                depth = (paths >= 0).sum(-1)  # [B, F]; a node of depth d sits at position c - 1 + d
                stats.draft_forwards += 1
                logits = drafter.forward_tree(node_tokens.gather(1, nodes), depth - 1,
                                              visible_slots(fed, paths, nodes), draft_state)
                fed = torch.cat([fed, nodes], 1)
                return law(logits, depth)

            tree = grow_tree(law(root, torch.zeros_like(committed[:, None]))[:, 0], expand, shape, generator)
            drafter.rollback(draft_state, committed)  # the tree's slots leave the drafter's cache
        stats.draft_forwards += 1
        with timer("target"):
            layout = tree.layout()
            window = torch.cat([rows.seq.gather(1, committed[:, None] - 1), tree.tokens], 1)  # [B, 1 + nodes]
            logits = model.forward_tree(window, layout.depth, layout.ancestors, state)
        stats.target_forwards += 1
        with timer("verify"):
            p = probs_of(logits, sampling, committed[:, None] + layout.depth, forced)  # slot s predicts c + depth
            walk = verify_tree(p, tree, generator, layout=layout, draws=(G, self.tree_width))
            drafts = window.gather(1, walk.path.clamp(min=0))  # [B, D] the accepted path's tokens
            self._commit(rows, drafts, VerifyResult(walk.n_accepted, walk.next_token, walk.path >= 0), tree.n_nodes)
        with timer("target"):
            model.keep_path(state, walk.path)  # the accepted path's keys/values onto the slots after x_{c-1}
            model.rollback(state, rows.committed - 1)
        return committed

    @staticmethod
    def _commit(rows: Commits, drafts: torch.Tensor, result: VerifyResult, drafted: torch.Tensor) -> None:
        """Write each active row's n accepted drafts [B, >= n] and its closing token after its committed tokens."""
        n = result.n_accepted[:, None]
        window = torch.arange(drafts.shape[1] + 1, device=n.device)
        run = torch.cat([drafts, result.next_token[:, None]], 1)
        run = torch.where(window == n, result.next_token[:, None], run)  # j < n: a draft, j = n: the closing token
        positions = rows.committed[:, None] + window
        write = rows.active[:, None] & (window <= n)
        rows.seq.scatter_(1, positions, torch.where(write, run, rows.seq.gather(1, positions)))
        rows.advance(result, drafted)

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
        if self.tree:
            require_methods(model, TREE_METHODS, "DraftModel(tree_width > 1)")
            require_methods(self.drafter, TREE_METHODS, "DraftModel(tree_width > 1)'s drafter")
        return self.drafter
