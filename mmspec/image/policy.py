"""`decoding="auto"`: the fastest exact decoding for the model, device and batch size at hand — and plain AR when no
speculative configuration pays.

Speculative Jacobi decoding with a window of W tokens needs fewer target forwards than AR, but each forward scores W
positions. On a GPU a W-token window costs about what one token costs; on a CPU, or at a large batch, the forward is
compute-bound and a wide window costs several AR steps, so the best window depends on the device and the batch. The
policy predicts the seconds of one batch of B images decoded with window W as

    T(W, B) = prefill(B) + N / c(W, B) * cost(W, B)          (W = 1: AR, c = 1)

- cost(W, B): seconds of one iteration of the candidate: one target forward of a W-token window for B samples (their
  CFG rows included) followed by the logits processing of its W positions, measured at the middle of the image
  (`measure_cost_curve`), plus what the iteration spends outside that forward — drafting, verification, redraft,
  commit, bookkeeping — measured on the candidate's own step (`measure_overheads`, which also times the prefill that
  every decoding pays once). On a model with captured steps (a pipeline on CUDA) cost(W, B) is instead one
  iteration of the candidate's whole step replayed from its graph, forward included (`measure_replayed_iterations`):
  eager launches would misprice both the forward and the kernels around it. All are measured once per model,
  device, batch size and CFG setting and cached on disk (`mmspec.core.runtime.measured.MeasurementCache`), keyed and
  checked by fingerprints of the model and of the device, so a curve measured elsewhere is never reused;
- c(W, B): the step compression (image tokens per batch forward, prefill excluded; a batch runs until its slowest row
  finishes) that SJD with maximal coupling and horizontal init reaches, measured on the embedded model
  (`compression_prior.json`, written by `python -m mmspec.eval.bench_image --measure-prior`) and scaled by what this
  pipeline's own runs reached (`DecodingPolicy.record`): the excess over AR, c - 1, times the mean ratio of observed to
  predicted excess.

The candidates are SJD's chain at every window of `WINDOWS` and SJD-PAC's frontier trees of `TREES` (window W, K
candidates at D draft positions: one forward scores its T nodes, so its cost is the curve's at T tokens, interpolated
between measured windows; its compression c is measured like the chains', `tree_compression` in the prior file), and,
where the pipeline has an EAGLE head with a measured acceptance (its config's `acceptance`, which `train_heads`
writes), the head's exact chains of `HEAD_LENGTHS` drafts (`HeadChain`): their c follows from the head's held-out
acceptance per depth (`head_compression`), scaled by what this pipeline's head runs reached, and their iteration
cost holds the head's drafting, measured on their own step like the rest (replayed from its graph on a model with
captured steps, as the others).
It picks the candidate of least T and runs it when that is predicted at least `MARGIN` times faster than AR, else AR.
A choice, once made, holds for that batch size and CFG setting for the life of the policy (one per pipeline) until a
run far off its prediction (`DecodingPolicy`) or `reconsider()` / `remeasure()`; calls with a generator keep the
choice the first of them was given, whatever the machine's load does in between, until `reconsider()`, so a seed
gives the same image on every call. What later runs reach changes the choices made after that, and those of batch
sizes not yet seen.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ContextManager, Protocol

import torch

from mmspec.core.probs import SamplingConfig, process_logits
from mmspec.core.runtime.capture import StepRunner
from mmspec.core.runtime.measured import (
    GAP,
    PROBE_TOLERANCE,
    Clock,
    HeldChoices,
    MeasurementCache,
    Renewals,
    device_fingerprint,
    modules_fingerprint,
    settled,
    synchronize,
    timings,
    within,
)
from mmspec.core.stats import SpecStats
from mmspec.image.loop import open_decoding, step_graphs, step_key
from mmspec.image.methods.ar import AR
from mmspec.image.methods.base import ImageDecoding
from mmspec.image.methods.heads import DraftHeads
from mmspec.image.methods.sjd import SJD
from mmspec.image.protocol import DiscreteImageModel

logger = logging.getLogger(__name__)

WINDOWS = (2, 3, 4, 6, 8, 12, 16, 24, 32)  # the windows the policy considers (AR is W = 1)
TREES = ((8, 2, 2), (16, 2, 2), (32, 2, 2))  # the frontier trees it considers: (window, tree_width, tree_depth)
HEAD_LENGTHS = (1, 2, 3, 4)  # the draft head chains it considers: drafts per round
MARGIN = 1.1  # predicted speedup SJD must reach to be chosen (the prediction's own error, within 20 % measured)
HISTORY = 32  # runs the acceptance estimate averages over
REPEATS = 5  # timed rounds per measurement (after one untimed); their lower quartile (`settled`) is the cost
NOISE = 0.2  # how much cheaper than a narrower window a wider one may time before its curve is judged impossible
ATTEMPTS = 3  # measurements of a cost curve before an impossible one is used as it came (made non-decreasing)
PROBE_REPEATS = 3  # timed rounds of the probe that checks a cached curve before it is used
PRIOR_FILE = Path(__file__).with_name("compression_prior.json")
SJD_SETTINGS = {"init": "horizontal", "coupling": "maximal"}  # the exact SJD mode the prior was measured with
Tick = Callable[[], None] | None  # called after each part of a measurement (progress), or None


class Bar(Protocol):
    def update(self, n: int = 1) -> object: ...


Progress = Callable[[str, int], ContextManager[Bar]]  # (what is timed, parts) -> a bar, e.g. tqdm(desc=, total=)


@dataclass(frozen=True)
class Choice:
    """What `DecodingPolicy.choose` picked: the decoding, its window (1 = AR; a head's chain: the tokens its forward
    scores per row), the predicted speedup over AR, a one-line reason for the stats table, the candidate it ran as
    (None for AR), and the predicted seconds of one of its iterations and of opening a decoding (what a run's own
    time is checked against)."""

    decoding: ImageDecoding
    window: int
    predicted_speedup: float
    reason: str
    candidate: int | tuple[int, int, int] | HeadChain | None = None
    iteration_seconds: float | None = None
    prefill_seconds: float = 0.0


@dataclass(frozen=True, eq=False)
class HeadChain:
    """A policy candidate: exact drafting with the pipeline's EAGLE `head`, `length` drafts a round (`DraftHeads`);
    `acceptance`: the head's held-out acceptance per draft depth for the sampling at hand (the deepest measured one
    stands for the depths past it)."""

    head: torch.nn.Module
    length: int
    acceptance: tuple[float, ...]

    @property
    def name(self) -> str:
        """Its key in the cached measurements, with the head's identity (the model's keys the cache itself)."""
        return f"eagle L{self.length} {head_digest(self.head)}"

    def decoding(self) -> DraftHeads:
        return DraftHeads(kind="eagle", draft_length=self.length, head=self.head)


def head_digest(head: torch.nn.Module) -> str:
    """Eight hex digits identifying a head's class, config, size, dtype and device."""
    described = json.dumps(modules_fingerprint({"head": head}), sort_keys=True)
    return hashlib.sha256(described.encode()).hexdigest()[:8]


def head_compression(acceptance: Sequence[float], length: int) -> float:
    """Expected tokens per target forward of a chain of `length` drafts whose draft at depth d is accepted with
    probability acceptance[d - 1] once those before it were (the last value past the list): the expected accepted
    prefix, 1 + a_1 + a_1 a_2 + ..., counting the token the target adds."""
    expected, survive = 1.0, 1.0
    for depth in range(length):
        survive *= acceptance[min(depth, len(acceptance) - 1)]
        expected += survive
    return expected


def head_acceptance(head: torch.nn.Module | None, model: DiscreteImageModel,
                    sampling: SamplingConfig) -> tuple[float, ...] | None:
    """The acceptance per depth an EAGLE head's config records for this sampling (its guided laws' under
    classifier-free guidance), or None where it records none or cannot draft for `model` (another vocabulary, a model
    that hands out no features)."""
    recorded = None if head is None else getattr(head.config, "acceptance", None)
    if not recorded or head.config.vocab_size != model.vocab_size:
        return None
    if "features" not in getattr(model, "capabilities", ()):
        return None
    guided = sampling.guidance_scale != 1.0 and recorded.get("guided_by_depth")
    return tuple(guided or recorded["by_depth"])


def model_fingerprint(model: DiscreteImageModel) -> dict:
    """What identifies an adapter's model for its cost curve: the adapter class, image span and its modules."""
    modules = {name: value for name, value in vars(model).items() if isinstance(value, torch.nn.Module)}
    return modules_fingerprint(modules, adapter=type(model).__name__, grid=list(model.grid),
                               vocab_size=model.vocab_size)


# no_grad, not inference_mode, in the measurements: a model with captured steps keeps its caches and graphs across
# calls, and a tensor made in inference mode cannot be written outside it
@torch.no_grad()
def measure_cost_curve(model: DiscreteImageModel, condition, sampling: SamplingConfig,
                       windows=(1, *WINDOWS), repeats: int = REPEATS, tick: Tick = None,
                       clock: Clock = time.perf_counter) -> dict[int, float]:
    """Seconds of one target forward of a W-token window plus the processing of its W logits, per W, for the samples
    of `condition` (their CFG rows when `sampling` guides), after half the image's tokens are cached: the windows
    are timed in turn, `repeats` rounds after an untimed one, and each window's `settled` time is its cost. tick():
    called after each round (progress)."""
    N = model.grid[0] * model.grid[1]
    cfg = sampling.guidance_scale != 1.0
    state, logits = model.prefill(condition, cfg=cfg, max_window=max(windows))
    B, device = logits.cond.shape[0], logits.cond.device
    context = N // 2
    model.forward(torch.zeros(B, context, dtype=torch.long, device=device), state)
    keep = torch.full((B,), context, device=device)
    seconds: dict[int, list[float]] = {W: [] for W in windows}
    # Round robin over the windows, the first round untimed (allocator, kernel selection, a cold process's threads):
    # a slow spell of the machine then falls on a few rounds of every window, not on all rounds of a few windows,
    # and the lower quartile of each window's rounds steps over it.
    for _ in range(1 + repeats):
        for W in windows:
            tokens = torch.zeros(B, W, dtype=torch.long, device=device)

            def step(tokens=tokens):
                logits = model.forward(tokens, state)
                process_logits(logits.cond, sampling, logits.uncond)

            seconds[W] += timings(step, device, 1, after=lambda: model.rollback(state, keep), clock=clock)
        if tick is not None:
            tick()
    return {W: settled(times[1:]) for W, times in seconds.items()}


@torch.no_grad()
def measure_overheads(model: DiscreteImageModel, condition, sampling: SamplingConfig, candidates,
                      repeats: int = REPEATS, tick: Tick = None, clock: Clock = time.perf_counter) -> dict[str, float]:
    """Seconds per iteration that each candidate's step (1: AR's) spends beyond its forward: the step's time, every
    phase synchronized, minus the same forward (and logits processing) timed alone just before it, the `settled`
    difference of `repeats` such pairs at the start of an image after one untimed. It holds the drafting,
    verification, redraft, commit and bookkeeping, and what the forward loses to the work around it. Under
    "prefill": the seconds of opening a decoding (the condition's prefill and token 0), which every decoding pays
    once. tick(): called after each candidate (progress)."""
    device = model_device(model)
    overheads = {"prefill": measure_prefill(model, condition, sampling, repeats, clock)}
    N = model.grid[0] * model.grid[1]
    for candidate in candidates:
        decoding = candidate_decoding(candidate)
        decoding.check_model(model)  # as a decoding's run does (a head taps the target's features here)
        stats = SpecStats()

        def started():
            """The decoding's step on a new opening, its first iteration run (untimed): the host's bound on the
            cache's fill levels starts afresh too (rollbacks only lower it to the image's end)."""
            step = decoding.step(model, open_decoding(model, condition, sampling, None, stats, decoding.max_window,
                                                      decoding), sampling, None, stats)
            step()
            return step

        opening = open_decoding(model, condition, sampling, None, stats, decoding.max_window, decoding)
        tokens = torch.zeros(opening.first_token.shape[0], decoding.forward_width, dtype=torch.long, device=device)

        def forward():
            logits = model.forward(tokens, opening.state)
            process_logits(logits.cond, sampling, logits.uncond)

        def rollback():
            model.rollback(opening.state, torch.zeros_like(opening.first_token))

        # the forward alone and the step in pairs: a slow spell that spans a pair moves both of its times alike
        step, differences = started(), []
        for _ in range(1 + repeats):
            if N - step.progress().n_done <= decoding.forward_width:  # a small image is full: start another
                step = started()
            alone = timings(forward, device, 1, after=rollback, clock=clock)[0]
            differences.append(timings(step, device, 1, clock=clock)[0] - alone)
        overheads[candidate_name(candidate)] = max(0.0, settled(differences[1:]))
        if tick is not None:
            tick()
    return overheads


@torch.no_grad()
def measure_replayed_iterations(model: DiscreteImageModel, condition, sampling: SamplingConfig, candidates,
                                block: int = 8, repeats: int = REPEATS, tick: Tick = None,
                                clock: Clock = time.perf_counter) -> dict[str, float]:
    """`time_iterations` of each candidate's decoding (1: AR's) on a model with captured steps, keyed by
    `candidate_name`. Under "prefill": the seconds of opening a decoding. On a GPU a window forward and the kernels
    around it are then costed as one graph runs them, not as eager launches."""
    runs = {candidate_name(candidate): (model, candidate_decoding(candidate)) for candidate in candidates}
    return {"prefill": measure_prefill(model, condition, sampling, repeats, clock)} | time_iterations(
        runs, condition, sampling, block, repeats, tick, clock)


@torch.no_grad()
def time_iterations(runs: dict, condition, sampling: SamplingConfig, block: int = 8, repeats: int = REPEATS,
                    tick: Tick = None, clock: Clock = time.perf_counter) -> dict:
    """Settled seconds of one iteration of each decoding's whole step as a decoding runs it, per key of `runs`
    (key -> (model, decoding)): blocks of `block` iterations (replayed from the model's step graphs where it has
    them, else eager), with the read of the progress that follows each block. Each decoding is timed once a round,
    `repeats` rounds after an untimed one (whose blocks capture the graphs the timed ones, and the pipeline's own
    decodings, then replay), round robin, so that a slow spell of the machine falls on a few rounds of every
    decoding, not on all rounds of a few. A step has fixed shapes, so an iteration costs the same whatever it
    accepts. tick(): called after each round (progress)."""
    for model, decoding in runs.values():
        decoding.check_model(model)  # as a decoding's run does (a head taps the target's features here)
    times = {key: [] for key in runs}
    for _ in range(1 + repeats):
        for key, (model, decoding) in runs.items():
            times[key].append(timed_block(model, condition, sampling, decoding, block, clock))
        if tick is not None:
            tick()
    return {key: settled(seconds[1:]) for key, seconds in times.items()}


def timed_block(model: DiscreteImageModel, condition, sampling: SamplingConfig, decoding: ImageDecoding, block: int,
                clock: Clock) -> float:
    """Seconds per iteration of one block of `block` iterations and the progress read after it, on a new decoding
    whose first iteration and first block ran untimed."""
    stats = SpecStats()
    opening = open_decoding(model, condition, sampling, None, stats, decoding.max_window, decoding)
    step = decoding.step(model, opening, sampling, None, stats)
    runner = StepRunner(step, stats, opening.timer, step_graphs(model), step_key(decoding, sampling, opening))
    runner.run(1)  # a decoding's first iteration runs eagerly
    runner.run(block)
    synchronize(model_device(model))
    began = clock()
    runner.run(block)
    runner.step.progress()
    seconds = (clock() - began) / block
    runner.finish()
    return seconds


def measure_prefill(model: DiscreteImageModel, condition, sampling: SamplingConfig, repeats: int,
                    clock: Clock = time.perf_counter) -> float:
    """Settled seconds of opening a decoding (the condition's prefill and token 0), which every decoding pays once."""
    return settled(timings(lambda: open_decoding(model, condition, sampling, None, SpecStats()), model_device(model),
                           repeats, warmup=1, clock=clock))


def candidate_name(candidate: int | tuple[int, int, int] | HeadChain) -> str:
    """A candidate's key in the cached overheads: "W", "WxKxD" for a frontier tree, `HeadChain.name` for a head's."""
    if isinstance(candidate, HeadChain):
        return candidate.name
    return tree_key(candidate) if isinstance(candidate, tuple) else str(candidate)


def load_prior(path: Path = PRIOR_FILE) -> dict[int, dict[int, float]]:
    """The embedded model's step compression, batch size -> window -> c(W, B)."""
    saved = json.loads(path.read_text())
    return {int(B): {int(W): float(c) for W, c in row.items()} for B, row in saved["compression"].items()}


def tree_key(tree: tuple[int, int, int]) -> str:
    """How a frontier tree (window, tree_width, tree_depth) is named in the prior file: "16x2x2"."""
    return "x".join(map(str, tree))


def load_tree_prior(path: Path = PRIOR_FILE) -> dict[int, dict[tuple[int, int, int], float]]:
    """The embedded model's step compression with frontier trees, batch size -> (W, K, D) -> c; empty if the file
    has none."""
    saved = json.loads(path.read_text()).get("tree_compression", {})
    return {int(B): {tuple(int(x) for x in key.split("x")): float(c) for key, c in row.items()}
            for B, row in saved.items()}


def candidate_decoding(candidate: int | tuple[int, int, int] | HeadChain) -> ImageDecoding:
    """What a measured candidate runs: AR for 1, a head's chain, else `candidate_sjd`."""
    if isinstance(candidate, HeadChain):
        return candidate.decoding()
    return AR() if candidate == 1 else candidate_sjd(candidate)


def candidate_sjd(candidate: int | tuple[int, int, int]) -> SJD:
    """The exact SJD a policy candidate runs: a window W, or a frontier tree (W, tree_width, tree_depth)."""
    if isinstance(candidate, tuple):
        window, tree_width, tree_depth = candidate
        return SJD(window=window, tree_width=tree_width, tree_depth=tree_depth, **SJD_SETTINGS)
    return SJD(window=candidate, **SJD_SETTINGS)


def prior_row(prior: dict[int, dict], batch_size: int) -> dict:
    """A prior's row for a batch size: the smallest measured batch size >= B (the largest if none)."""
    sizes = sorted(prior)
    return prior[next((B for B in sizes if B >= batch_size), sizes[-1])]


def consistent(curve: dict[int, float], noise: float = NOISE) -> bool:
    """Whether a cost curve is physically possible: no window cheaper than a narrower one by more than `noise` (a
    relative margin for timing noise). A curve timed while the machine was busy can break it (window 2 at a tenth of
    window 1), and any prediction read from it would be wrong."""
    rising = monotone(curve)  # each window's cost: the highest of it and every narrower one
    return all(curve[W] >= (1 - noise) * rising[W] for W in curve)


def monotone(curve: dict[int, float]) -> dict[int, float]:
    """The curve with each window at least as costly as every narrower one (what a wider forward does, up to noise)."""
    widths = sorted(curve)
    return dict(zip(widths, itertools.accumulate((curve[W] for W in widths), max), strict=True))


def cost_at(curve: dict[int, float], width: int) -> float:
    """The curve's seconds at `width` tokens: measured, or linear between the nearest measured widths (beyond the
    widest, along its last segment)."""
    if width in curve:
        return curve[width]
    widths = sorted(curve)
    below = max((W for W in widths if W < width), default=widths[0])
    above = min((W for W in widths if W > width), default=None)
    if above is None:
        below, above = widths[-2], widths[-1]
    return curve[below] + (curve[above] - curve[below]) * (width - below) / (above - below)


class DecodingPolicy:
    """Chooses the decoding of `decoding="auto"` calls for one pipeline and learns from their outcomes.

    `choose(model, condition, batch_size, sampling)` measures the cost curve on first use for that model, device,
    batch size and CFG setting (or reads it from `cache`), predicts T(W, B) for AR and every window and returns a
    `Choice`, the same one on every later call for them; `record(choice, batch_size, stats)` folds a finished run's
    step compression into the acceptance estimate and checks its time against the prediction; `reconsider()` makes
    the next calls choose again with it, and `remeasure()` also measures their cost curves again (overwriting the
    cached ones).

    A busy machine cannot mislead it for long: each measurement interleaves what it compares and keeps the lower
    quartile of its rounds (`settled`); a curve on which a wider window costs less than a narrower one beyond `NOISE`
    is measured again, up to `ATTEMPTS` times, and made non-decreasing; a cached curve is used only if it is possible
    and a cheap probe (AR's forward and the widest window's, now) agrees with it within `PROBE_TOLERANCE`; no
    candidate's iteration is priced below AR's; and a run whose iterations take more than `GAP` times the predicted
    time (or less than 1 / `GAP`) has its cost curve measured again on the next call, which chooses again (`record`
    returns the note its stats carry) — except a call with a generator, which keeps the choice seeded calls were
    given, so that a seed repeats its image. `check_cached=False` trusts the cache: a cached curve is read as it is (if
    possible) and a run's gap is reported but refreshes nothing. `clock` reads the seconds (a test passes a
    simulated machine's).
    """

    def __init__(self, cache: MeasurementCache | None = None, prior: dict[int, dict[int, float]] | None = None,
                 windows=WINDOWS, margin: float = MARGIN,
                 tree_prior: dict[int, dict[tuple[int, int, int], float]] | None = None,
                 progress: Progress | None = None, clock: Clock = time.perf_counter, check_cached: bool = True):
        self.cache = cache if cache is not None else MeasurementCache("cost_curves")
        self.progress = progress  # shows each measurement as it runs (a pipeline's progress bar), None: silent
        self.clock, self.check_cached = clock, check_cached
        self.prior = prior if prior is not None else load_prior()
        self.tree_prior = tree_prior if tree_prior is not None else load_tree_prior()
        self.windows, self.margin = tuple(windows), margin
        # observed / prior excess compression (c - 1) of the last runs auto chose SJD for, and a head's chain for
        self.history: deque[float] = deque(maxlen=HISTORY)
        self.head_history: deque[float] = deque(maxlen=HISTORY)
        self.renewals = Renewals()  # which cached measurements to take again (remeasure(), a run's gap)
        self.choices: HeldChoices[Choice] = HeldChoices()  # per (model, batch size, CFG)

    def reconsider(self) -> None:
        """Forget the choices made so far: the next call of each batch size, seeded or not, chooses again from its
        cost curve and what this policy's runs reached."""
        self.choices.forget()

    def remeasure(self) -> None:
        """Measure the cost curves again (and overwrite the cached ones) on the next call of each batch size, and
        choose again."""
        self.renewals.remeasure_all()
        self.reconsider()

    @contextlib.contextmanager
    def measuring(self, description: str, total: int) -> Iterator[Tick]:
        """A tick to call after each of `total` parts of a measurement: a bar of `self.progress` says what is being
        timed (the first call of a batch size measures for seconds to minutes), or nothing without one."""
        if self.progress is None:
            yield None
            return
        with self.progress(description, total) as bar:
            yield lambda: bar.update(1)

    @staticmethod
    def curve_key(batch_size: int, sampling: SamplingConfig) -> str:
        return f"B={batch_size} {'cfg' if sampling.guidance_scale != 1.0 else 'no cfg'}"

    def saved(self, model_print: dict, device_print: dict, key: str) -> dict | None:
        """The cached measurement under `key`, or None where it is to be measured again (`remeasure()`, or a run
        that found it off)."""
        if self.renewals.due(key):
            return None
        return self.cache.get(model_print, device_print, key)

    def store(self, model_print: dict, device_print: dict, key: str, values: dict[str, float]) -> None:
        self.cache.put(model_print, device_print, key, values)
        self.renewals.measured(key)

    def cost_curve(self, model: DiscreteImageModel, condition, batch_size: int,
                   sampling: SamplingConfig) -> tuple[dict[int, float], bool]:
        """(the cost curve, whether it was measured now rather than read from the cache)."""
        device = model_device(model)
        model_print, device_print = model_fingerprint(model), device_fingerprint(device)
        key = self.curve_key(batch_size, sampling)
        saved = self.saved(model_print, device_print, key)
        curve = None if saved is None else {int(W): seconds for W, seconds in saved.items()}
        if curve is not None and set(curve) >= {1, *self.windows}:
            doubt = self.doubt(curve, model, condition, batch_size, sampling)
            if doubt is None:
                return curve, False
            logger.warning("the cached cost curve for %s %s: measuring it again", key, doubt)
        windows = (1, *self.windows)
        for attempt in range(1, ATTEMPTS + 1):
            again = f" (again, {attempt} of {ATTEMPTS}: the last was impossible)" if attempt > 1 else ""
            with self.measuring(f"timing window forwards {', '.join(map(str, windows))} for batch {batch_size}"
                                f"{again}", 1 + REPEATS) as tick:
                curve = measure_cost_curve(model, condition, sampling, windows, tick=tick, clock=self.clock)
            if consistent(curve):
                break
        else:
            logger.warning("the cost curve for %s timed impossible %d times (a wider window cheaper than a narrower "
                           "one: is the machine busy?); each window is priced at least as every narrower one",
                           key, ATTEMPTS)
        curve = monotone(curve)
        self.store(model_print, device_print, key, {str(W): seconds for W, seconds in curve.items()})
        return curve, True

    def doubt(self, curve: dict[int, float], model: DiscreteImageModel, condition, batch_size: int,
              sampling: SamplingConfig) -> str | None:
        """Why a cached `curve` is not to be used, or None: it is impossible (`consistent`), or a probe now (AR's
        forward and the widest window's, `PROBE_REPEATS` rounds) finds the widest window's cost in AR forwards off
        the curve's by more than `PROBE_TOLERANCE` (a curve timed on a busy machine, or another machine's)."""
        if not consistent(curve):
            return "is impossible (a wider window timed cheaper than a narrower one)"
        if not self.check_cached:
            return None
        widest = max(curve)
        with self.measuring(f"checking the cached cost curve for batch {batch_size}", 1 + PROBE_REPEATS) as tick:
            probe = measure_cost_curve(model, condition, sampling, (1, widest), PROBE_REPEATS, tick, self.clock)
        return disagreement(f"window {widest}", curve[widest] / curve[1], probe[widest] / probe[1], "forwards")

    def replay_doubt(self, saved: dict[str, float], model: DiscreteImageModel, condition, batch_size: int,
                     sampling: SamplingConfig, candidates) -> str | None:
        """Why cached replayed iterations are not to be used, or None: a probe now (AR's replayed step and the
        widest candidate's, `PROBE_REPEATS` rounds) finds the widest one's cost in AR steps off the cached figures'
        by more than `PROBE_TOLERANCE`."""
        if not self.check_cached:
            return None
        widest = max(candidates, key=lambda c: candidate_decoding(c).forward_width)
        name = candidate_name(widest)
        with self.measuring(f"checking the cached replayed steps for batch {batch_size}", 1 + PROBE_REPEATS) as tick:
            probe = measure_replayed_iterations(model, condition, sampling, (1, widest), repeats=PROBE_REPEATS,
                                                tick=tick, clock=self.clock)
        return disagreement(describe(candidate_decoding(widest)), saved[name] / saved["1"], probe[name] / probe["1"],
                            "steps")

    def overheads(self, model: DiscreteImageModel, condition, batch_size: int, sampling: SamplingConfig,
                  candidates) -> dict[str, float]:
        """Seconds per iteration each candidate spends outside the forward (`measure_overheads`), cached like the
        cost curves."""
        model_print, device_print = model_fingerprint(model), device_fingerprint(model_device(model))
        key = self.curve_key(batch_size, sampling) + " overhead"
        wanted = {"prefill", *(candidate_name(c) for c in candidates)}
        saved = self.saved(model_print, device_print, key)
        if saved is not None and set(saved) >= wanted:
            return saved
        with self.measuring(f"timing the steps of {len(candidates)} decodings for batch {batch_size}",
                            len(candidates)) as tick:
            overheads = measure_overheads(model, condition, sampling, candidates, tick=tick, clock=self.clock)
        self.store(model_print, device_print, key, overheads)
        return overheads

    def replayed_iterations(self, model: DiscreteImageModel, condition, batch_size: int, sampling: SamplingConfig,
                            candidates) -> tuple[dict[str, float], bool]:
        """(seconds per replayed iteration of each candidate, `measure_replayed_iterations`, and whether they were
        measured now), cached like the cost curves."""
        model_print, device_print = model_fingerprint(model), device_fingerprint(model_device(model))
        key = self.curve_key(batch_size, sampling) + " replayed"
        wanted = {"prefill", *(candidate_name(c) for c in candidates)}
        saved = self.saved(model_print, device_print, key)
        if saved is not None and set(saved) >= wanted:
            doubt = self.replay_doubt(saved, model, condition, batch_size, sampling, candidates)
            if doubt is None:
                return saved, False
            logger.warning("the cached replayed iterations for %s %s: measuring them again", key, doubt)
        with self.measuring(f"timing the replayed steps of {len(candidates)} decodings for batch {batch_size}",
                            1 + REPEATS) as tick:
            seconds = measure_replayed_iterations(model, condition, sampling, candidates, tick=tick,
                                                  clock=self.clock)
        self.store(model_print, device_print, key, seconds)
        return seconds, True

    def prior_compression(self, window: int | tuple[int, int, int] | HeadChain, batch_size: int) -> float:
        """c(W, B) of the embedded model: the prior at the smallest measured batch size >= B (the largest if none),
        linear in W between measured windows; for a frontier tree (W, K, D), its own measured c; for a head's chain,
        what the head's acceptance gives at batch 1 (a batch's slowest row sets its pace: the runs' own record
        corrects that)."""
        if isinstance(window, HeadChain):
            return head_compression(window.acceptance, window.length)
        row = prior_row(self.tree_prior if isinstance(window, tuple) else self.prior, batch_size)
        if window in row or isinstance(window, tuple):
            return row[window]
        below = max((W for W in row if W < window), default=min(row))
        above = min((W for W in row if W > window), default=max(row))
        if above == below:
            return row[below]
        return row[below] + (row[above] - row[below]) * (window - below) / (above - below)

    def compression(self, window: int | tuple[int, int, int] | HeadChain, batch_size: int) -> float:
        """Predicted c(W, B): the prior's excess over AR scaled by the mean observed / prior ratio of this pipeline's
        runs of its kind (SJD's, the head's), and at most W (a tree's window, a chain's drafts and one)."""
        history = self.history_of(window)
        scale = statistics.fmean(history) if history else 1.0
        if isinstance(window, HeadChain):
            W = window.length + 1
        else:
            W = window[0] if isinstance(window, tuple) else window
        return min(float(W), 1.0 + (self.prior_compression(window, batch_size) - 1.0) * scale)

    def history_of(self, candidate: int | tuple[int, int, int] | HeadChain) -> deque[float]:
        """The observed / prior ratios of this pipeline's runs of the candidate's kind: a head's chains, or SJD."""
        return self.head_history if isinstance(candidate, HeadChain) else self.history

    def trees(self, batch_size: int) -> list[tuple[int, int, int]]:
        """The frontier trees with a prior at this batch size's row."""
        return sorted(prior_row(self.tree_prior, batch_size)) if self.tree_prior else []

    def choose(self, model: DiscreteImageModel, condition, batch_size: int, sampling: SamplingConfig,
               head: torch.nn.Module | None = None, seeded: bool = False) -> Choice:
        """The choice for this model, batch size and CFG setting (and the pipeline's EAGLE `head`, if any): made by
        `predict` on first call, the same one after; a run far off its prediction has the next call choose again,
        except a `seeded` call (one with a generator), which keeps the choice the first seeded call was given, so
        that its seed repeats its image (`HeldChoices`)."""
        key = json.dumps([model_fingerprint(model), self.curve_key(batch_size, sampling),
                          head and head_digest(head)], sort_keys=True)
        return self.choices.get(key, seeded, lambda: self.predict(model, condition, batch_size, sampling, head))

    def head_chains(self, model: DiscreteImageModel, head: torch.nn.Module | None,
                    sampling: SamplingConfig) -> list[HeadChain]:
        """The head's chains of `HEAD_LENGTHS` drafts, where it records its acceptance."""
        acceptance = head_acceptance(head, model, sampling)
        if acceptance is None:
            return []
        return [HeadChain(head, length, acceptance) for length in HEAD_LENGTHS]

    def predict(self, model: DiscreteImageModel, condition, batch_size: int, sampling: SamplingConfig,
                head: torch.nn.Module | None = None) -> Choice:
        """The decoding of least predicted time for this model, device, batch size and CFG setting, now."""
        N = model.grid[0] * model.grid[1]
        trees = self.trees(batch_size) if "tree" in getattr(model, "capabilities", ()) else []
        candidates = {c: candidate_decoding(c) for c in (*self.windows, *trees, *self.head_chains(model, head,
                                                                                                     sampling))}
        iteration, prefill, measured = self.iteration_costs(model, condition, batch_size, sampling, candidates)
        # no candidate's iteration costs less than AR's one-token step (its forward is wider, its step does more):
        # a timing below it is noise, and would predict more than the candidate's tokens per forward
        iteration = {c: max(seconds, iteration[1]) for c, seconds in iteration.items()}
        seconds = {c: prefill + N / self.compression(c, batch_size) * iteration[c] for c in candidates}
        best = min(seconds, key=seconds.get)
        decoding, speedup = candidates[best], (prefill + N * iteration[1]) / seconds[best]
        source = "measured now" if measured else "cached"
        name = describe(decoding)
        if speedup >= self.margin:
            replayed = ", replayed from graphs" if step_graphs(model) is not None else ""
            reason = (f"auto: {name} predicted {speedup:.2f}x AR at batch {batch_size} (an iteration with its "
                      f"{decoding.forward_width}-token forward costs {iteration[best] / iteration[1]:.1f} AR steps "
                      f"here{replayed}, cost curve {source})")
            return Choice(decoding, getattr(decoding, "window", decoding.forward_width), speedup, reason, best,
                          iteration[best], prefill)
        reason = (f"auto: ar, no window pays at batch {batch_size} (best: {name} predicted "
                  f"{speedup:.2f}x < {self.margin}x; cost curve {source})")
        return Choice(AR(), 1, 1.0, reason, None, iteration[1], prefill)

    def iteration_costs(self, model: DiscreteImageModel, condition, batch_size: int, sampling: SamplingConfig,
                        candidates: dict) -> tuple[dict, float, bool]:
        """(seconds of one iteration of AR (key 1) and of each candidate, seconds of opening a decoding, whether
        anything was measured now). A model with captured steps (a pipeline on CUDA) times them replayed; else the
        cost curve's forward plus the step's overhead outside it, timed eagerly."""
        if step_graphs(model) is not None:
            replayed, measured = self.replayed_iterations(model, condition, batch_size, sampling, (1, *candidates))
            return ({c: replayed[candidate_name(c)] for c in (1, *candidates)}, replayed["prefill"], measured)
        curve, measured = self.cost_curve(model, condition, batch_size, sampling)
        outside = self.overheads(model, condition, batch_size, sampling, (1, *candidates))
        widths = {1: 1, **{c: decoding.forward_width for c, decoding in candidates.items()}}  # of each one's forward
        iteration = {c: cost_at(curve, width) + outside[candidate_name(c)] for c, width in widths.items()}
        return iteration, outside["prefill"], measured

    def record(self, choice: Choice, batch_size: int, sampling: SamplingConfig, stats) -> str | None:
        """Fold the observed step compression of a finished run of `choice` into the acceptance estimate, and check
        the run's seconds per iteration against the prediction: off by more than `GAP`, the measurements behind the
        choice are taken again on the next call, which chooses again. Returns the note for the run's stats then."""
        iterations = stats.target_forwards - stats.prefill_forwards
        if choice.candidate is not None:
            observed = float(stats.new_tokens.max()) / max(1, iterations)
            prior = self.prior_compression(choice.candidate, batch_size)
            self.history_of(choice.candidate).append(max(0.0, observed - 1.0) / (prior - 1.0))
        if not choice.iteration_seconds or iterations <= 0 or "total" not in stats.timings:
            return None
        ran = max(0.0, stats.timings["total"] - choice.prefill_seconds) / iterations
        ratio = ran / choice.iteration_seconds
        if within(ratio, GAP):
            return None
        note = f"its iterations took {ratio:.3g}x the predicted {choice.iteration_seconds * 1e3:.3g} ms"
        if self.check_cached:
            key = self.curve_key(batch_size, sampling)
            self.renewals.mark_stale(key, f"{key} overhead", f"{key} replayed")
            self.choices.refresh()
            note += f": the cost curve for batch {batch_size} is measured again on the next call"
        logger.warning("auto: %s", note)
        return note


def disagreement(what: str, expected: float, found: float, unit: str) -> str | None:
    """None where a probe's cost ratio to AR (`found`) is within `PROBE_TOLERANCE` of the cached one (`expected`),
    else why the cache is off."""
    if within(found / expected, 1 + PROBE_TOLERANCE):
        return None
    return f"disagrees with a probe now ({what} costs {found:.2f} AR {unit}, the cache says {expected:.2f})"


def describe(decoding: ImageDecoding) -> str:
    """A candidate's name in a choice's reason: "sjd window 16 with a 2 x 2 frontier tree", "eagle head, 2 drafts a
    round"."""
    if isinstance(decoding, DraftHeads):
        return f"{decoding.kind} head, {decoding.draft_length} drafts a round"
    name = f"sjd window {decoding.window}"
    if decoding.tree:
        name += f" with a {decoding.tree_width} x {decoding.tree_depth} frontier tree"
    return name


def model_device(model: DiscreteImageModel) -> torch.device:
    """The device of the adapter's first module with parameters (CPU if none)."""
    for value in vars(model).values():
        if isinstance(value, torch.nn.Module):
            first = next(value.parameters(), None)
            if first is not None:
                return first.device
    return torch.device("cpu")
