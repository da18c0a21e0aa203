"""Speculative Jacobi decoding (SJD) for discrete image AR models, with its exact successors.

- SJD (Teng et al. 2024, arXiv 2410.01699): a window of L tokens after the committed prefix is scored in one target
  forward; every draft is accepted with min(1, p/q), where q is the law it was drawn from, and the first rejected
  position is resampled from norm(max(p - q, 0)). The drafts of the next iteration are fresh samples of this
  iteration's outputs (`coupling="none"`).
- Coupled redrafting (MC-SJD, So et al. 2025, arXiv 2510.24211): a position's next draft is coupled to its current
  one so that it changes only when it must. `coupling="maximal"` keeps the current draft x with probability
  min(1, p_t(x)/q(x)) and otherwise draws from norm(max(p_t - q, 0)); this is the same operator as SJD-PAC's
  *adaptive continuation* (Kang et al. 2026, arXiv 2603.18599: verification goes on past the first rejection and
  only the rejected positions are resampled). `coupling="gumbel"` shares one Gumbel vector per position across
  iterations and drafts argmax(log p_t + g).
- Draft initialisation of positions no window has reached yet: `"random"` (uniform over the image tokens, carrying
  the uniform law, which accepts with min(1, V p(x)) where the one-hot bookkeeping of the official code accepts with
  p(x)), `"horizontal"` (the token to the left) or `"vertical"` (the token one grid row above), both deterministic
  given earlier positions, so they carry a one-hot law, or `"lookahead"`: a sample of the target's own law at the
  last output position of the row's previous forward (the prefill's law of image token 0 before the first window),
  the law just past the window, stored as the draft's q. Structure tokens (what `forced_tokens` names, e.g. Emu3's
  end-of-line) are never an initial draft of a free position: random and lookahead drafts skip them (the lookahead
  law is renormalised over the draftable ids), copies come from the nearest free position (`DraftSpan`).

One iteration for a row with c committed tokens and window W = min(L, N - c):
    inputs  [x_{c-1}, d_c, ..., d_{c+W-2}]     x_{c-1} is the last committed token, whose key/value is not cached yet
    outputs p_c, ..., p_{c+W-1}                  target laws, after CFG / temperature / top-k / top-p (`process_logits`)
The accepted drafts plus one token (the residual at the first rejection, or a sample of p after the last draft) are
committed; the cache keeps the keys/values of x_{c-1} and the accepted drafts; the new last token opens the next
window. Rows advance independently: every row keeps its own committed length, window position and cache length.

Why every mode is exact. Attach to each image position i the randomness drawn *for* it: its draft initialisation, the
uniforms and samples of its acceptance test and redrafts, its Gumbel vector. Nothing computed for a position < i ever
reads randomness of position i: outputs are causal, and which iteration verifies i and which window covers it depend
only on the tests at positions < i. Let F_i be everything drawn for positions < i. By induction over iterations, the
draft at i has law q given F_i, where q is the law stored with it: an initial draft is uniform, a function of F_i, or a
lookahead sample (its law is an output of a forward whose inputs all lie before i, so a function of F_i, and it is drawn
with a uniform of its own); a fresh redraft is a sample of p_t, whose value is fixed by F_i; a maximally coupled redraft
is MRS(x, q, p_t) with x ~ q given F_i, which is distributed as p_t (the speculative-sampling lemma, applied to the
draft rather than to the output); a Gumbel redraft argmax(log p_t + g_i) is distributed as p_t because g_i is
independent of F_i. When i is verified, all of x_{<i} is committed and the target law there is the model's conditional
p(. | x_{<i}), so accept-with-min(1, p/q)-else-residual emits x_i ~ p(. | x_{<i}) given F_i: the committed sequence has
the AR joint law. Storing the stale q with a kept token, resampling from p instead of the residual, verifying draft i
against the law of i - 1, or forcing an acceptance each break one step of this argument;
`tests/image/test_jacobi_law.py` shows the law test rejecting each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from mmspec.core.acceptance import Acceptance, Exact
from mmspec.core.component import DecodingComponent
from mmspec.core.drafts import Draft
from mmspec.core.probs import SamplingConfig
from mmspec.core.rng import Generators, inverse_cdf, keyed_uniform, sample_seeds, uniform
from mmspec.core.stats import SpecStats
from mmspec.core.trees import DraftTree
from mmspec.core.verify import (
    Relaxed,
    VerifyResult,
    accept_probability,
    chain_outcome,
    first_rejection,
    residual_law,
)
from mmspec.image.decoding import Commits, forced_at, image_span, open_decoding, probs_of
from mmspec.image.frontier import FrontierTree, merge
from mmspec.image.lantern import relaxation_for
from mmspec.image.protocol import TREE_METHODS, DiscreteImageModel, require_methods
from mmspec.options import COUPLINGS, INITS


@dataclass(frozen=True)
class JacobiStep:
    """One window's verification and redraft.

    verify: n_accepted [B], next_token [B] (the residual or bonus token that closes the committed run) and
    accept_mask [B, W - 1]. tokens: [B, W], the token at each output position: committed for j <= n_accepted, the
    next draft after it. laws: [B, W, V], the law each next draft was drawn from (this iteration's p).
    """

    verify: VerifyResult
    tokens: torch.Tensor
    laws: torch.Tensor


def jacobi_step(
    p: torch.Tensor,
    drafts: torch.Tensor,
    q: torch.Tensor,
    lengths: torch.Tensor,
    uniforms: torch.Tensor,
    coupling: str,
    gumbel: torch.Tensor | None = None,
    relaxation: Relaxed | None = None,
) -> JacobiStep:
    """Verify a window of drafts and draw the next drafts; pure tensor code, no host sync.

    p: [B, W, V] target laws at the window's output positions; drafts: [B, W - 1] the drafts at the first W - 1 of
    them, drawn from q: [B, W - 1, V]; lengths: [B] long, how many drafts of each row are real (the rest lie past
    the image); uniforms: [B, 3, >= W] U[0, 1) draws for the acceptance tests, the residual samples and the fresh
    samples of p (the caller draws a fixed number per row, so a row's random stream depends on nothing else);
    gumbel: [B, W, V] the output positions' Gumbel vectors when coupling == "gumbel". relaxation: LANTERN or GSD
    relaxed acceptance (lossy): drafts are accepted on their neighbourhood (group) mass and the first rejection draws
    from the rule's residual; the redrafts past it stay the exact maximal coupling, so every stored draft law is still
    exact.
    """
    B, W, V = p.shape
    has_draft = torch.arange(W - 1, device=p.device) < lengths[:, None]  # [B, W - 1]
    p_draft = p[:, :-1]  # p_j scores the draft at output position j
    p_x = p_draft.gather(-1, drafts[..., None]).squeeze(-1)
    q_x = q.gather(-1, drafts[..., None]).squeeze(-1)
    keep = (uniforms[:, 0, : W - 1] < accept_probability(p_x, q_x)) & has_draft  # exact; also couples the redrafts
    residual = inverse_cdf(residual_law(p_draft, q), uniforms[:, 1, : W - 1])  # [B, W - 1]
    fresh = inverse_cdf(p, uniforms[:, 2, :W])  # [B, W]
    # Maximal coupling of each draft with p: the draft where the exact test keeps it, else the residual; a position
    # without a draft (the last one, or past a row's real drafts) draws p. Exact acceptance commits it at j = n.
    at_drafts = torch.where(has_draft, torch.where(keep, drafts, residual), fresh[:, :-1])
    coupled = torch.cat([at_drafts, fresh[:, -1:]], 1)
    if relaxation is None:
        accept, excess = keep, None
        n = first_rejection(accept)  # [B]
        next_token = coupled.gather(1, n[:, None]).squeeze(1)
    else:  # the core's chain test with the same uniforms; the closing token is drawn with the uniform of its kind
        outcome = chain_outcome(p, Draft(drafts, lengths, q), uniforms[:, 0, : W - 1], relaxation)
        accept, excess, n = outcome.accept_mask, outcome.excess_acceptance, outcome.n_accepted
        u_residual = uniforms[:, 1].gather(1, n.clamp(max=max(W - 2, 0))[:, None]).squeeze(1)
        u_fresh = uniforms[:, 2].gather(1, n[:, None]).squeeze(1)
        next_token = inverse_cdf(outcome.next_law, torch.where(outcome.rejected, u_residual, u_fresh))
    if coupling == "maximal":
        redraft = coupled
    elif coupling == "gumbel":
        redraft = (p.log() + gumbel).argmax(-1)
    else:
        redraft = fresh
    position = torch.arange(W, device=p.device)
    accepted = torch.nn.functional.pad(drafts, (0, 1))  # [B, W]; the padded last column is never before n
    tokens = torch.where(position < n[:, None], accepted,
                         torch.where(position == n[:, None], next_token[:, None], redraft))
    verified = VerifyResult(n_accepted=n, next_token=next_token, accept_mask=accept, excess_acceptance=excess)
    return JacobiStep(verified, tokens, p)


@dataclass(frozen=True)
class SJD(DecodingComponent):
    """Speculative Jacobi decoding, batched, with per-row acceptance.

    window: L, tokens scored per target forward (1 = plain AR). init: how positions no window has reached are
    drafted, one of `INITS`. coupling: how the drafts past the committed run are redrafted, one of `COUPLINGS`.
    acceptance: `Exact()` (lossless for every setting above) or `Lantern(k, delta, lam)` (relaxed, lossy), or its
    name. tree_width: candidates per position at the window's first `tree_depth` draft positions (SJD-PAC's frontier
    tree, `mmspec.image.frontier`; exact; 1 = SJD's single chain, and then `tree_depth` is not read). It needs an
    adapter with `forward_tree` / `keep_path` (LlamaGen's and the embedded models').
    """

    name: ClassVar[str] = "sjd"
    modality: ClassVar[str] = "image"
    window: int = 16
    init: str = "horizontal"
    coupling: str = "maximal"
    acceptance: Acceptance = Exact()
    tree_width: int = 1
    tree_depth: int = 2

    def __post_init__(self):
        self.check_count("window", "tokens scored per target forward")
        self.check_choice("init", INITS)
        self.check_choice("coupling", COUPLINGS)
        self.check_count("tree_width", "candidates per tree position")
        self.check_count("tree_depth", "draft positions with a tree")
        super().__post_init__()
        if self.tree_width > 1:
            if not isinstance(self.acceptance, Exact):
                raise ValueError(f"tree_width > 1 verifies with RSD, which is exact: acceptance must be 'exact', got "
                                 f"{self.acceptance.name!r}")
            if self.tree_depth >= self.window:
                raise ValueError(f"tree_depth must be < window ({self.window}), got {self.tree_depth}")
        elif self.tree_depth != SJD.tree_depth:
            raise ValueError(f"tree_depth is read only with tree_width > 1, got tree_depth={self.tree_depth} and "
                             f"tree_width=1")

    @property
    def tree(self) -> bool:
        return self.tree_width > 1

    @property
    def forward_width(self) -> int:
        """Tokens one target forward scores per row: the window, or the frontier tree's nodes."""
        return FrontierTree.build(self.window, self.tree_width, self.tree_depth).size if self.tree else self.window

    @torch.no_grad()
    def __call__(
        self, model: DiscreteImageModel, condition, sampling: SamplingConfig, generator: Generators, stats: SpecStats
    ):
        L = self.window
        relaxation = relaxation_for(self.acceptance, model, image_span(model)[1], sampling)  # checked before prefill
        trees = Trees(self.window, self.tree_width, self.tree_depth, model) if self.tree else None
        opening = open_decoding(model, condition, sampling, generator, stats,
                                max_window=L if trees is None else trees.widest)
        N, V, forced, state, timer = opening.N, opening.V, opening.forced, opening.state, opening.timer
        B, device, dtype = opening.first_token.shape[0], opening.first_token.device, opening.dtype

        # seq holds each row's committed tokens, then its current drafts, over absolute positions 0 .. N + L - 1
        # (past N: scratch for windows that overhang the image). The law each draft was drawn from is kept for the
        # live positions only: drafts lie in [committed, committed + L), so a ring of L laws indexed by position
        # mod L never overwrites a live one. Gumbel vectors are keyed by (row seed, position, id), not stored.
        with timer("draft"):
            rows = Commits(opening.first_token, N, L, stats)
            seq = rows.seq
            laws = Ring(torch.zeros(B, L, V, dtype=dtype, device=device))
            seeds = sample_seeds(generator, B).to(device) if self.coupling == "gumbel" else None
            span = DraftSpan.of(forced, N, L, V, device)
            ahead = opening.first_law  # [B, V] the law just past each row's last window, for init="lookahead"
            everywhere = torch.arange(seq.shape[1], device=device)
        drafted_end = rows.committed.clone()  # positions < drafted_end hold a committed token or a draft
        try:
            yield rows.progress()
            while rows.minimum < N:
                W = min(L, N - rows.minimum)
                committed, active = rows.committed, rows.active
                inputs_at = committed[:, None] - 1 + torch.arange(W, device=device)  # [B, W] absolute positions
                outputs_at = inputs_at + 1
                with timer("draft"):
                    # A fixed number of draws per row and iteration (init, accept, residual, fresh), whatever W is.
                    uniforms = uniform((B, 4, L), generator, device, dtype)
                    drafted = everywhere < drafted_end[:, None]
                    initialise_drafts(self.init, seq, laws, inputs_at[:, 1:], True, drafted, uniforms[:, 0],
                                      model.grid[1], forced, span, ahead)
                    inputs = seq.gather(1, inputs_at)
                    q = laws.read(inputs_at[:, 1:])  # [B, W - 1, V]
                    lengths = rows.draft_lengths(W)
                    tree = None if trees is None else trees.drafted(W, inputs, q, lengths, generator)
                with timer("target"):
                    logits = model.forward(inputs, state) if tree is None else model.forward_tree(
                        tree.tokens, tree.layout.level, tree.layout.ancestors, state)
                stats.target_forwards += 1
                with timer("verify"):
                    if tree is None:
                        p = probs_of(logits, sampling, outputs_at, forced)  # [B, W, V]
                    else:  # node t predicts the image position after its own, c + level[t]
                        p_nodes = probs_of(logits, sampling, committed[:, None] + tree.layout.level, forced)
                        p = p_nodes[:, :W]
                    g = None if seeds is None else gumbel(seeds, outputs_at, V, p.dtype)
                    result = jacobi_step(p, inputs[:, 1:], q, lengths, uniforms[:, 1:], self.coupling, g, relaxation)
                    verified, tokens = result.verify, result.tokens
                    if tree is not None:
                        walk = tree.layout.walk(p_nodes, tree.tree, uniforms[:, 1], tree.uniforms)
                        verified, tokens, path = merge(verified, tokens, walk, tree.tokens, uniforms[:, 2],
                                                       uniforms[:, 3])
                    write_at(seq, outputs_at, tokens, active[:, None])
                    laws.write(outputs_at, result.laws, active[:, None])
                    last = result.laws.gather(1, _rows(lengths[:, None], V)).squeeze(1)  # a row's last real output
                    ahead = torch.where(active[:, None], last, ahead)
                    drafted_end = torch.where(active, committed + W, drafted_end)
                    rows.advance(verified, lengths)
                with timer("target"):
                    if tree is not None:
                        model.keep_path(state, path)  # the accepted path's keys/values onto the main chain's slots
                    model.rollback(state, rows.committed - 1)  # the last committed token opens the next window
                yield rows.progress()
        finally:  # also when the caller stops early: count what was committed
            rows.finish(opening.started)


def initialise_drafts(
    init: str,
    seq: torch.Tensor,
    laws: Ring,
    positions: torch.Tensor,
    where: torch.Tensor | bool,
    drafted: torch.Tensor,
    draws: torch.Tensor,
    width: int,
    forced: torch.Tensor | None,
    span: DraftSpan,
    ahead: torch.Tensor | None = None,
) -> torch.Tensor:
    """Draft the positions [B, W'] that hold nothing yet (not `drafted` [B, N + L] bool) and that `where` [B, W']
    selects, by the rule `init` (one of `INITS`), in place; returns the [B, W'] bool mask of those drafted now.

    draws: [B, >= W'] uniforms for the random and lookahead rules; ahead: [B, V] each row's law just past its last
    window (lookahead only). A copy comes from the nearest drafted free position before the run of new positions
    (horizontal) or from the nearest drafted position straight above (vertical, the horizontal copy where there is
    none). Free positions get image tokens only (`span`); forced positions their token, with a one-hot law."""
    V = laws.buffer.shape[-1]
    count = positions.shape[1]
    if init == "random":
        F = span.ids.shape[0]
        tokens = span.ids[(draws[:, :count] * F).long().clamp(max=F - 1)]
        law = span.uniform.to(laws.buffer.dtype).expand(*positions.shape, V)
    elif init == "lookahead":
        law = span.restrict(ahead).to(laws.buffer.dtype)[:, None].expand(*positions.shape, V)
        tokens = inverse_cdf(law, draws[:, :count])
    else:
        everywhere = torch.arange(drafted.shape[1], device=drafted.device)
        last_known = torch.where(drafted & span.free, everywhere, -1).cummax(1).values  # [B, N + L]
        before = (positions - 1).clamp(min=0)
        last = last_known.gather(1, before)
        source = torch.where(last >= 0, last, before)
        if init == "vertical":  # the nearest drafted row above; the smallest step m wins
            above = torch.full_like(positions, -1)
            for m in range((count - 1) // width + 1, 0, -1):
                candidate = positions - m * width
                found = (candidate >= 0) & drafted.gather(1, candidate.clamp(min=0))
                above = torch.where(found, candidate, above)
            source = torch.where(above >= 0, span.last_free_at(above.clamp(min=0)), source)
        tokens = seq.gather(1, source)
        law = torch.nn.functional.one_hot(tokens, V).to(laws.buffer.dtype)
    if forced is not None:
        token = forced_at(forced, positions)
        tokens = torch.where(token >= 0, token, tokens)
        law = torch.where((token >= 0)[..., None], torch.nn.functional.one_hot(tokens, V).to(laws.buffer.dtype), law)
    new = ~drafted.gather(1, positions) & where
    write_at(seq, positions, tokens, new)
    laws.write(positions, law, new)
    return new


@dataclass(frozen=True)
class DraftedTree:
    """One iteration's frontier tree: its layout, the window as a DraftTree (`FrontierTree.draft`), each slot's token
    [B, T] (the root, then the tree's nodes) and the walk's uniforms for the children after the first [B, depth,
    width - 1]."""

    layout: FrontierTree
    tree: DraftTree
    tokens: torch.Tensor
    uniforms: torch.Tensor


class Trees:
    """The frontier-tree layouts of one decoding (one per window width: the last windows of an image are narrower),
    and the draws of each iteration: a fixed number per row whatever the width, so a row's random stream does not
    depend on its batch."""

    def __init__(self, window: int, width: int, depth: int, model: DiscreteImageModel):
        require_methods(model, TREE_METHODS, "tree_width > 1")
        self.width, self.depth = width, depth
        self.full = FrontierTree.build(window, width, depth)
        self.widest = self.full.size
        self._layouts: dict[int, FrontierTree] = {}

    def drafted(self, W: int, inputs: torch.Tensor, q: torch.Tensor, lengths: torch.Tensor,
                generator: Generators) -> DraftedTree | None:
        """Draw the alternates of a window of W main nodes (inputs [B, W], q [B, W - 1, V]); None when W leaves no
        room for a tree (W < 2)."""
        B, V, device = inputs.shape[0], q.shape[-1], inputs.device
        gumbel_uniforms = [uniform((B, g.shape[0], V), generator, device, q.dtype) for g in self.full.groups]
        walk_uniforms = uniform((B, self.depth, self.width - 1), generator, device, q.dtype)
        if W < 2:
            return None
        if W not in self._layouts:
            self._layouts[W] = FrontierTree.build(W, self.width, self.depth, device)
        layout = self._layouts[W]
        tree = layout.draft(inputs, q, lengths, gumbel_uniforms)
        return DraftedTree(layout, tree, torch.cat([inputs[:, :1], tree.tokens], 1), walk_uniforms[:, : layout.depth])


@dataclass(frozen=True)
class DraftSpan:
    """What a free position's initial draft may be: never a structure token (an id some position is forced to, e.g.
    an end-of-line), which has probability 0 there.

    ids: [F] long, the draftable ids; uniform: [V], the uniform law over them; last_free: [N + L] long, for each
    absolute position the nearest free position at or before it; free: [N + L] bool, the positions no token is
    forced at (positions >= N are scratch, free)."""

    ids: torch.Tensor
    uniform: torch.Tensor
    last_free: torch.Tensor
    free: torch.Tensor

    @classmethod
    def of(cls, forced: torch.Tensor | None, N: int, L: int, V: int, device: torch.device) -> DraftSpan:
        free = torch.ones(N + L, dtype=torch.bool, device=device)
        draftable = torch.ones(V, dtype=torch.bool, device=device)
        if forced is not None:
            free[:N] = forced < 0
            draftable[forced[forced >= 0]] = False
            if not draftable.any():  # every id is forced somewhere: nothing to exclude
                draftable[:] = True
        positions = torch.arange(N + L, device=device)
        last_free = torch.where(free, positions, -1).cummax(0).values
        ids = draftable.nonzero().flatten()
        return cls(ids, draftable.float() / len(ids), torch.where(last_free >= 0, last_free, positions), free)

    def restrict(self, law: torch.Tensor) -> torch.Tensor:
        """law [B, V] renormalised over the draftable ids; the uniform law over them where it has no mass there."""
        law = law * (self.uniform > 0)
        mass = law.sum(-1, keepdim=True)
        return torch.where(mass > 0, law / mass.clamp(min=torch.finfo(law.dtype).tiny), self.uniform.to(law))

    def last_free_at(self, positions: torch.Tensor) -> torch.Tensor:
        """The nearest free position at or before each of `positions` (any shape, values in [0, N + L))."""
        return self.last_free[positions]


@dataclass(frozen=True)
class Ring:
    """Per-row V-wide rows kept for a sliding span of positions: buffer [B, R, V] holds position i in slot i mod R,
    so any R consecutive positions coexist. Reads and writes take absolute positions [B, W], W <= R."""

    buffer: torch.Tensor

    def read(self, positions: torch.Tensor) -> torch.Tensor:
        """[B, W, V], the rows at `positions`."""
        return self.buffer.gather(1, _rows(positions % self.buffer.shape[1], self.buffer.shape[-1]))

    def write(self, positions: torch.Tensor, values: torch.Tensor, where: torch.Tensor) -> None:
        """Store values [B, W, V] at `positions` where `where` [B, W] (broadcastable) holds, in place."""
        write_at(self.buffer, positions % self.buffer.shape[1], values, where)


def gumbel(seeds: torch.Tensor, positions: torch.Tensor, V: int, dtype: torch.dtype) -> torch.Tensor:
    """Gumbel(0, 1) vectors [B, W, V] of the image positions [B, W], keyed by (row seed [B], position, id): a
    position gets the same vector in every iteration that redrafts it, and no buffer of them is kept."""
    ids = torch.arange(V, device=positions.device)
    u = keyed_uniform(seeds[:, None, None], positions[..., None], ids, dtype=torch.float64)  # in (0, 1)
    return (-(-u.log()).log()).to(dtype)


def _rows(positions: torch.Tensor, V: int) -> torch.Tensor:
    """Index [B, W, V] that gathers/scatters the V-wide rows at `positions` [B, W] along dim 1."""
    return positions[..., None].expand(-1, -1, V)


def write_at(buffer: torch.Tensor, positions: torch.Tensor, values: torch.Tensor, where: torch.Tensor) -> None:
    """buffer[b, positions[b, w]] = values[b, w] where `where` [B, W] (broadcastable) holds, in place; buffer is
    [B, S] (tokens) or [B, S, V] (laws)."""
    index = positions if buffer.ndim == 2 else _rows(positions, buffer.shape[-1])
    mask = where if buffer.ndim == 2 else where[..., None]
    buffer.scatter_(1, index, torch.where(mask, values, buffer.gather(1, index)))
