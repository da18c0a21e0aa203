"""The image decoding loop, written once for every method: open (prefill the condition, draw image token 0), then
repeat the method's step until every row has its N tokens, yielding a `DecodeStep` after every target forward so a
pipeline can drive progress bars, callbacks and interruption.

A step (`ImageStep`) owns one iteration — propose, verify, commit — on tensors whose shapes do not depend on what was
accepted, with no host read; the loop reads the host once per iteration (`progress()`: the fewest tokens a row has,
for the bar and for the end). `Commits` is the per-row bookkeeping the speculative steps share; `ARStep` is the
baseline's step. Shapes: B samples, N image tokens, V image-token ids, W window.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from mmspec.core.model import Logits
from mmspec.core.probs import SamplingConfig, one_hot, process_logits
from mmspec.core.progress import Halt, Progress
from mmspec.core.rng import Generators, check_generators, sample
from mmspec.core.rules.base import TokenTest
from mmspec.core.runtime.capture import StepRunner, block_size, iterations_left, weights_of
from mmspec.core.settings import runtime_fields
from mmspec.core.speculation import Round
from mmspec.core.stats import PhaseTimer, SpecStats
from mmspec.core.verify import VerifyResult
from mmspec.image.protocol import DiscreteImageModel

PAD_ID = -1  # not-yet-generated positions of DecodeStep.tokens


@dataclass(kw_only=True)
class DecodeStep(Progress):
    """Progress after one target forward (or a block of them).

    step: 0-based iteration index; n_done: the fewest committed tokens of a row (the loop's end); tokens: [B, N]
    long, a snapshot of the committed image tokens, PAD_ID where not generated yet; n_committed: [B] long, committed
    tokens per row (tokens[b, :n_committed[b]] are final).
    """

    tokens: torch.Tensor
    n_committed: torch.Tensor


class ImageStep(Protocol):
    """One iteration of an image decoding, and the progress the loop reads between iterations."""

    def __call__(self) -> None:
        """Propose, verify and commit once for every row still generating (no host read)."""

    def progress(self) -> DecodeStep:
        """What is committed so far (one host read: the fewest committed tokens of a row)."""

    def finish(self) -> None:
        """Fold the stats once the decoding ends (also when the caller stops early)."""


@torch.no_grad()
def decode(decoding, model: DiscreteImageModel, condition: Any, sampling: SamplingConfig, generator: Generators,
           stats: SpecStats, block: int | None = None) -> Iterator[DecodeStep]:
    """The loop of every image decoding (`ImageDecoding.run`): a `DecodeStep` after the prefill and after every block
    of iterations of `decoding`'s step. A block is as many iterations as the rows are expected to need still (up to
    16, `mmspec.core.runtime.capture.block_size`; at most `block`), so the host reads the progress once per block; with
    the model's step graphs (`model.graphs.steps`, CUDA graphs or their CPU tape) a block replays one captured graph."""
    decoding.check_sampling(sampling.temperature)
    decoding.check_model(model)
    opening = open_decoding(model, condition, sampling, generator, stats, decoding.max_window, decoding)
    step = decoding.step(model, opening, sampling, generator, stats)
    runner = StepRunner(step, stats, opening.timer, step_graphs(model), step_key(decoding, sampling, opening))
    halt = Halt()
    try:
        progress = opened(opening)
        progress.halt = halt
        yield progress
        while progress.n_done < opening.N and not halt.stopped:
            left = iterations_left(opening.N - progress.n_done, progress.n_done - 1, runner.iterations,
                                   decoding.forward_width)
            runner.run(block_size(left, block))
            progress = runner.step.progress()
            progress.halt = halt
            yield progress
    finally:  # also when the caller stops early (closes this generator): count what was committed
        runner.finish()


def opened(opening: Opening) -> DecodeStep:
    """The progress right after the prefill, known without a host read: every row holds its first token."""
    B, N = opening.first_token.shape[0], opening.N
    tokens = torch.full((B, N), PAD_ID, dtype=torch.long, device=opening.first_token.device)
    tokens[:, 0] = opening.first_token
    return DecodeStep(step=0, n_done=1, tokens=tokens, n_committed=torch.ones_like(opening.first_token))


def step_graphs(model: DiscreteImageModel):
    """The model's captured steps for the decoding it has just opened (`model.graphs.steps`), or None (eager)."""
    return getattr(getattr(model, "graphs", None), "steps", None)


def step_key(decoding, sampling: SamplingConfig, opening: Opening) -> tuple:
    """What makes two decodings' steps replayable by the same captured graphs: the settings, and the models in its
    runtime fields (a drafter, a head) by their weights, which a captured step reads."""
    slots = getattr(getattr(opening.state, "cache", None), "capacity", None)  # a fixed-capacity cache's
    models = tuple(weights_of(getattr(decoding, name)) for name in runtime_fields(decoding))
    return (type(decoding), decoding.describe(), models, sampling, opening.first_token.shape[0], opening.dtype,
            opening.N, slots)


def image_span(model: DiscreteImageModel) -> tuple[int, int, torch.Tensor | None]:
    """(N image tokens, V image-token ids, forced tokens [N] long or None) of a model adapter."""
    grid, V = getattr(model, "grid", None), getattr(model, "vocab_size", None)
    if not (isinstance(grid, tuple) and len(grid) == 2 and all(isinstance(x, int) and x > 0 for x in grid)):
        raise TypeError(
            f"model must be an image adapter exposing its image span as `grid` = (h, w) positive ints, got "
            f"{type(model).__name__} with grid={grid!r}"
        )
    if not (isinstance(V, int) and V > 0):
        raise TypeError(f"model must expose `vocab_size` (image-token ids 0..V-1) as a positive int, got {V!r}")
    N = grid[0] * grid[1]
    forced = getattr(model, "forced_tokens", None)
    if forced is not None and (forced.shape != (N,) or forced.max() >= V):
        raise ValueError(
            f"model.forced_tokens must be [{N}] long with ids < {V} (-1 = free), got shape {tuple(forced.shape)}"
        )
    return N, V, forced


def forced_at(forced: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The forced token at each of `positions` [B, W] (absolute; >= N is scratch past the image), -1 where free."""
    N = forced.shape[0]
    return torch.where(positions < N, forced[positions.clamp(max=N - 1)], -1)


def probs_of(logits: Logits, sampling: SamplingConfig, positions: torch.Tensor,
             forced: torch.Tensor | None = None) -> torch.Tensor:
    """Processed probabilities [B, W, V] of (CFG-paired) logits [B, W, V] that predict the image tokens at
    `positions` [B, W]; past `sampling.cfg_interval` the conditional logits alone; where `forced` [N] names a token
    the law is that token's one-hot (positions >= N are scratch and left as they are)."""
    uncond = logits.uncond
    if uncond is not None and sampling.cfg_interval >= 0:  # uncond = cond makes the guided logits cond exactly
        uncond = torch.where((positions > sampling.cfg_interval + 1)[..., None], logits.cond, uncond)
    p = process_logits(logits.cond, sampling, uncond)
    if forced is None:
        return p
    token = forced_at(forced, positions)  # [B, W]
    return torch.where((token >= 0)[..., None], one_hot(token.clamp(min=0), p.shape[-1], p.dtype), p)


@dataclass(frozen=True)
class Opening:
    """What every image decoding starts from: the condition (what the model's prefill took), the image span (N
    tokens, V ids, forced tokens [N] or None), the model's state after the condition prefill, image token 0 of each
    row ([B] long, drawn from the prefill's law first_law [B, V] with the caller's generator), the dtype of the
    processed laws (float32, or float64 for a float64 model), the decoding's acceptance rule bound to the model (None
    without one), the phase timer of `stats` and the start time."""

    condition: Any
    N: int
    V: int
    forced: torch.Tensor | None
    state: Any
    first_token: torch.Tensor
    first_law: torch.Tensor
    dtype: torch.dtype
    test: TokenTest | None
    timer: PhaseTimer
    started: float

    def law(self, logits: Logits, positions: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
        """`probs_of` with this image's forced tokens: the laws [B, W, V] of the tokens at `positions` [B, W]."""
        return probs_of(logits, sampling, positions, self.forced)


def open_decoding(model: DiscreteImageModel, condition: Any, sampling: SamplingConfig, generator: Generators,
                  stats: SpecStats, max_window: int = 1, decoding=None) -> Opening:
    """Check the span, bind `decoding`'s acceptance rule to the model (before any forward: a setting the model cannot
    take costs none), prefill the condition (one target forward, counted) and draw image token 0."""
    started = time.perf_counter()
    timer = PhaseTimer(stats.timings)
    N, V, forced = image_span(model)
    test = None if decoding is None else decoding.bind(model, V)
    with timer("target"):
        state, logits = model.prefill(condition, cfg=sampling.guidance_scale != 1.0, max_window=max_window)
    stats.target_forwards += 1
    stats.prefill_forwards += 1
    B, device = logits.cond.shape[0], logits.cond.device
    check_generators(generator, B)
    with timer("sample"):
        p0 = probs_of(logits.at(slice(-1, None)), sampling, torch.zeros(B, 1, dtype=torch.long, device=device), forced)
        first_token = sample(p0[:, 0], generator)
    return Opening(condition, N, V, forced, state, first_token, p0[:, 0], p0.dtype, test, timer, started)


class Commits:
    """Per-row progress of a speculative image decoding: the committed token buffer, committed lengths, and the
    stats that follow them (steps, acceptance map, totals). Shared by the steps that verify windows of drafts.

    seq: [B, N + extra] long, committed tokens then whatever the decoding keeps past them (drafts, scratch);
    committed: [B] long, tokens committed per row; minimum: its smallest value as a host int.
    """

    def __init__(self, opening: Opening, extra: int, stats: SpecStats):
        first_tokens, N = opening.first_token, opening.N
        B, device = first_tokens.shape[0], first_tokens.device
        self.N, self.stats, self.started = N, stats, opening.started
        self.seq = torch.zeros(B, N + extra, dtype=torch.long, device=device)
        self.seq[:, 0] = first_tokens
        self.committed = torch.ones(B, dtype=torch.long, device=device)
        self.stepped = torch.ones(B, dtype=torch.bool, device=device)  # rows the last step committed for
        self.step = torch.zeros((), dtype=torch.long, device=device)  # iterations so far (updated in place)
        self.minimum = 1
        self._positions = torch.arange(N, device=device)
        stats.steps = torch.zeros(B, dtype=torch.long, device=device)
        stats.acceptance_map = torch.zeros(B, N, dtype=torch.long, device=device)

    @property
    def active(self) -> torch.Tensor:
        """[B] bool, rows still generating."""
        return self.committed < self.N

    @property
    def last(self) -> torch.Tensor:
        """[B] long, each row's last committed token x_{c-1} (the root of its next draft)."""
        return self.seq.gather(1, self.committed[:, None] - 1).squeeze(1)

    def room(self, W: int) -> torch.Tensor:
        """[B] long, real drafts of a window of W target positions (those that predict an image token)."""
        return ((self.N - self.committed).clamp(max=W) - 1).clamp(min=0)

    def commit(self, round: Round) -> None:
        """Commit a speculative round (`mmspec.core.speculation`): its accepted drafts and closing token."""
        self.write(round.emitted[:, :-1], round.result, round.drafted)

    def write(self, drafts: torch.Tensor, result: VerifyResult, drafted: torch.Tensor) -> None:
        """Write each active row's n accepted drafts [B, >= n] and its closing token after its committed tokens, and
        commit them (`advance`)."""
        n = result.n_accepted[:, None]
        window = torch.arange(drafts.shape[1] + 1, device=n.device)
        run = torch.cat([drafts, result.next_token[:, None]], 1)
        run = torch.where(window == n, result.next_token[:, None], run)  # j < n: a draft, j = n: the closing token
        positions = self.committed[:, None] + window
        write = self.active[:, None] & (window <= n)
        self.seq.scatter_(1, positions, torch.where(write, run, self.seq.gather(1, positions)))
        self.advance(result, drafted)

    def advance(self, result: VerifyResult, lengths: torch.Tensor) -> None:
        """Commit each active row's accepted drafts plus the closing token (the caller wrote them into seq) and record
        the step: who committed what (acceptance map) and the acceptance counts. No host sync."""
        self.step += 1
        active = self.active
        self.stepped.copy_(active)
        advanced = torch.where(active, self.committed + result.n_accepted + 1, self.committed)
        newly = (self._positions >= self.committed[:, None]) & (self._positions < advanced[:, None])
        self.stats.acceptance_map.copy_(torch.where(newly, self.step, self.stats.acceptance_map))  # no .item()
        self.stats.record_step(result, lengths, active=active)
        self.committed.copy_(advanced)

    def progress(self) -> DecodeStep:
        """Sync the smallest committed length to the host (the loop's bound) and snapshot the committed tokens."""
        self.minimum, step = torch.stack([self.committed.min(), self.step]).tolist()  # one host read
        tokens = torch.where(self.committed_mask(), self.seq[:, : self.N], PAD_ID)
        return DecodeStep(step=step, n_done=self.minimum, tokens=tokens, n_committed=self.committed.clone())

    def committed_mask(self) -> torch.Tensor:
        """[B, N] bool, the committed positions (a prefix of each row here)."""
        return self._positions < self.committed[:, None]

    def finish(self) -> None:
        """Fold the stats once the decoding ends (also when the caller stops early)."""
        (self.stats.new_tokens, self.stats.steps), = self.stats.finalize(
            torch.stack([self.committed.clamp(max=self.N), self.stats.steps]))  # one transfer
        self.stats.timings["total"] = time.perf_counter() - self.started


class ARStep:
    """Plain autoregressive sampling with a KV cache: one token per target forward (the baseline every speedup is
    measured against). Every row advances together; the next position lives on the device (updated in place), so
    the step can be captured like the speculative ones."""

    def __init__(self, model: DiscreteImageModel, opening: Opening, sampling: SamplingConfig, generator: Generators,
                 stats: SpecStats):
        self.model, self.opening, self.sampling, self.generator, self.stats = model, opening, sampling, generator, stats
        stats.speculative = False
        B, device = opening.first_token.shape[0], opening.first_token.device
        self.tokens = torch.full((B, opening.N), PAD_ID, dtype=torch.long, device=device)
        self.tokens[:, 0] = opening.first_token
        self.position = torch.ones((), dtype=torch.long, device=device)  # the token this step draws
        self.done = 1  # tokens drawn, as of the last `progress()`

    def __call__(self) -> None:
        timer, B, N = self.opening.timer, self.tokens.shape[0], self.opening.N
        position = self.position.expand(B, 1)
        with timer("target"):
            logits = self.model.forward(self.tokens.gather(1, position - 1), self.opening.state)
        self.stats.target_forwards += 1
        with timer("sample"):
            p = self.opening.law(logits.at(slice(-1, None)), position, self.sampling)
            token = sample(p[:, 0], self.generator)[:, None]
            at = position.clamp(max=N - 1)
            self.tokens.scatter_(1, at, torch.where(position < N, token, self.tokens.gather(1, at)))
            self.position += 1

    def progress(self) -> DecodeStep:
        self.done = min(int(self.position), self.opening.N)  # one host read
        B = self.tokens.shape[0]
        committed = torch.full((B,), self.done, dtype=torch.long, device=self.tokens.device)
        return DecodeStep(step=self.done - 1, n_done=self.done, tokens=self.tokens.clone(), n_committed=committed)

    def finish(self) -> None:
        B, N, stats = self.tokens.shape[0], self.opening.N, self.stats
        self.done = min(int(self.position), N)
        stats.steps = torch.full((B,), self.done - 1, dtype=torch.long)
        stats.new_tokens = torch.full((B,), self.done, dtype=torch.long)
        stats.acceptance_map = torch.arange(N).expand(B, N)  # forward i (0 = the prefill) commits token i
        stats.timings["total"] = time.perf_counter() - self.opening.started
        stats.finalize()
