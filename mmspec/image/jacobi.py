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

import torch

from mmspec.core.drafts import Draft
from mmspec.core.probs import SamplingConfig, one_hot
from mmspec.core.rng import Generators, inverse_cdf, keyed_uniform, sample_seeds, uniform
from mmspec.core.rules.base import TokenTest
from mmspec.core.rules.exact import Exact, accept_probability, residual_law
from mmspec.core.stats import SpecStats
from mmspec.core.verify import VerifyResult, chain_outcome, first_rejection
from mmspec.image.frontier import ChainWindow, FrontierTrees
from mmspec.image.loop import Commits, DecodeStep, Opening, forced_at
from mmspec.image.protocol import DiscreteImageModel


@dataclass(frozen=True)
class JacobiOutcome:
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
    test: TokenTest | None = None,
) -> JacobiOutcome:
    """Verify a window of drafts and draw the next drafts; pure tensor code, no host sync.

    p: [B, W, V] target laws at the window's output positions; drafts: [B, W - 1] the drafts at the first W - 1 of
    them, drawn from q: [B, W - 1, V]; lengths: [B] long, how many drafts of each row are real (the rest lie past
    the image); uniforms: [B, 3, >= W] U[0, 1) draws for the acceptance tests, the residual samples and the fresh
    samples of p (the caller draws a fixed number per row, so a row's random stream depends on nothing else);
    gumbel: [B, W, V] the output positions' Gumbel vectors when coupling == "gumbel". test: another rule than the
    exact one, bound to the model (a relaxed, lossy rule accepts drafts on the mass of the codes near them, the
    first rejection drawn from the rule's residual); the redrafts past the first rejection stay the exact maximal
    coupling, so every stored draft law is still exact. None: the exact rule.
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
    if test is None:
        accept, excess = keep, None
        n = first_rejection(accept)  # [B]
        next_token = coupled.gather(1, n[:, None]).squeeze(1)
    else:  # the core's chain test with the same uniforms; the closing token is drawn with the uniform of its kind
        outcome = chain_outcome(p, Draft(drafts, lengths, q), uniforms[:, 0, : W - 1], test)
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
    return JacobiOutcome(verified, tokens, p)


class JacobiStep:
    """One SJD iteration on a window of L = `window` target positions for every row (windows past the image's end
    score scratch), the rows' randomness drawn in a fixed amount whatever happens: draft the positions no window has
    reached, score the window (`ChainWindow`, or with a frontier tree `FrontierTrees`), verify and redraft
    (`jacobi_step`), commit, roll the cache back to the new last token."""

    def __init__(self, sjd, model: DiscreteImageModel, opening: Opening, sampling: SamplingConfig,
                 generator: Generators, stats: SpecStats):
        self.model, self.opening, self.sampling, self.generator, self.stats = model, opening, sampling, generator, stats
        self.init, self.coupling, L, V = sjd.init, sjd.coupling, sjd.window, opening.V
        self.test = None if isinstance(sjd.acceptance, Exact) else opening.test
        B, device, dtype = opening.first_token.shape[0], opening.first_token.device, opening.dtype
        frontier = FrontierTrees(L, sjd.tree_width, sjd.tree_depth, device) if sjd.tree else ChainWindow(L, device)
        self.frontier = frontier
        # seq holds each row's committed tokens, then its current drafts, over absolute positions 0 .. N + L - 1
        # (past N: scratch for windows that overhang the image). The law each draft was drawn from is kept for the
        # live positions only: drafts lie in [committed, committed + L), so a ring of L laws indexed by position
        # mod L never overwrites a live one. Gumbel vectors are keyed by (row seed, position, id), not stored.
        with opening.timer("draft"):
            self.rows = Commits(opening, L, stats)
            self.laws = Ring.zeros(B, L, V, dtype, device)
            self.seeds = sample_seeds(generator, B).to(device) if self.coupling == "gumbel" else None
            self.span = DraftSpan.of(opening.forced, opening.N, L, V, device)
            self.ahead = opening.first_law.clone()  # [B, V] the law past each row's last window (init="lookahead")
            self.everywhere = torch.arange(self.rows.seq.shape[1], device=device)
            self.window = torch.arange(L, device=device)
        self.drafted_end = self.rows.committed.clone()  # positions < drafted_end hold a committed token or a draft

    def progress(self) -> DecodeStep:
        return self.rows.progress()

    def finish(self) -> None:
        self.rows.finish()

    def __call__(self) -> None:
        rows, opening, timer, seq, frontier = self.rows, self.opening, self.opening.timer, self.rows.seq, self.frontier
        B, L, V = seq.shape[0], self.window.shape[0], opening.V
        committed, active = rows.committed, rows.active
        inputs_at = committed[:, None] - 1 + self.window  # [B, L] absolute positions
        outputs_at = inputs_at + 1
        with timer("draft"):
            # A fixed number of draws per row and iteration (init, accept, residual, fresh).
            uniforms = uniform((B, 4, L), self.generator, seq.device, opening.dtype)
            drafted = self.everywhere < self.drafted_end[:, None]
            initialise_drafts(self.init, seq, self.laws, inputs_at[:, 1:], True, drafted, uniforms[:, 0],
                              self.model.grid[1], opening.forced, self.span, self.ahead)
            inputs = seq.gather(1, inputs_at)
            q = self.laws.read(inputs_at[:, 1:])  # [B, L - 1, V]
            lengths = rows.room(L)
            frontier.draft(inputs, q, lengths, self.generator)
        with timer("target"):
            logits = frontier.forward(self.model, inputs, opening.state)
        self.stats.target_forwards += 1
        with timer("verify"):
            p_slots = opening.law(logits, committed[:, None] + frontier.level, self.sampling)  # slot t: c + level[t]
            p = p_slots[:, :L]  # [B, L, V] the main chain's
            g = None if self.seeds is None else gumbel(self.seeds, outputs_at, V, p.dtype)
            step = jacobi_step(p, inputs[:, 1:], q, lengths, uniforms[:, 1:], self.coupling, g, self.test)
            verified, tokens = frontier.verify(step, p_slots, uniforms)
            write_at(seq, outputs_at, tokens, active[:, None])
            self.laws.write(outputs_at, step.laws, active[:, None])
            last = step.laws.gather(1, _rows(lengths[:, None], V)).squeeze(1)  # a row's last real output
            self.ahead.copy_(torch.where(active[:, None], last, self.ahead))  # state: updated in place
            self.drafted_end.copy_(torch.where(active, committed + L, self.drafted_end))
            rows.advance(verified, lengths)
        with timer("target"):
            frontier.keep(self.model, opening.state)  # a tree's accepted path onto the main chain's slots
            self.model.rollback(opening.state, rows.committed - 1)  # the last committed token opens the next window


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
        law = one_hot(tokens, V, laws.buffer.dtype)
    if forced is not None:
        token = forced_at(forced, positions)
        tokens = torch.where(token >= 0, token, tokens)
        law = torch.where((token >= 0)[..., None], one_hot(tokens, V, laws.buffer.dtype), law)
    new = ~drafted.gather(1, positions) & where
    write_at(seq, positions, tokens, new)
    laws.write(positions, law, new)
    return new


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
    """Per-row V-wide rows kept for a sliding span of R positions: buffer [B, R + 1, V] holds position i in slot
    i mod R, so any R consecutive positions coexist; slot R is scratch, where the rows a write masks off land (a write
    is one scatter, with no read of the rows it keeps). Reads and writes take absolute positions [B, W], W <= R."""

    buffer: torch.Tensor

    @classmethod
    def zeros(cls, batch_size: int, span: int, V: int, dtype: torch.dtype, device: torch.device) -> Ring:
        return cls(torch.zeros(batch_size, span + 1, V, dtype=dtype, device=device))

    @property
    def span(self) -> int:
        return self.buffer.shape[1] - 1

    def read(self, positions: torch.Tensor) -> torch.Tensor:
        """[B, W, V], the rows at `positions`."""
        return self.buffer.gather(1, _rows(positions % self.span, self.buffer.shape[-1]))

    def write(self, positions: torch.Tensor, values: torch.Tensor, where: torch.Tensor) -> None:
        """Store values [B, W, V] at `positions` where `where` [B, W] (bool, broadcastable) holds, in place."""
        slots = torch.where(where, positions % self.span, self.span)
        self.buffer.scatter_(1, _rows(slots, self.buffer.shape[-1]), values.expand(*slots.shape, -1))


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
