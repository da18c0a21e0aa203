"""`decoding="auto"` of `SpeculativeTextPipeline`: the fastest exact method for the models, device, batch size and
sampling mode at hand — measured, not guessed.

Text drafters cost different things: a draft model its own forwards, layer skip a share of the target's, an EAGLE
head one decoder layer, prompt lookup nothing — but it pays only on text that repeats its context — and every
speculative step scores L + 1 positions where AR scores one, with Python bookkeeping that a small model does not hide.
Which one wins depends on the machine and the text, so the policy times each drafter the pipeline offers (and AR, the
target's own `generate`) on the caller's prompts for `CALIBRATION_TOKENS` new tokens, once per models, device, batch
size, greedy or sampled decoding and settings, keeps the tokens per second on disk
(`mmspec.core.runtime.measured.MeasurementCache`) and picks the fastest; a speculative method must beat AR by `MARGIN`,
else AR runs. The tokens per second of each run it chose then join that method's figure (the mean of the calibration and
the last runs), so a method that stops paying on the caller's text loses its place once the choice is reconsidered: a
choice holds for its batch size and sampling mode for the life of the policy (one per pipeline) until a run far off
its figure (below) or `reconsider()` / `remeasure()`; calls with a generator keep the choice the first of them was
given, whatever the machine's load does in between, until `reconsider()`, so a seed gives the same completion on
every call.

A busy machine cannot mislead it for long: the methods are timed in `ROUNDS` interleaved rounds, each keeping its
`settled` (lower quartile) seconds; no method is credited more than AR's rate times its tokens per target forward (a
forward costs at least AR's step); cached figures are used after a probe (AR and the cached best, one round) agrees
with their ratio within `PROBE_TOLERANCE`; and a chosen run `GAP` times off its figure has the methods timed again
on the next call without a generator, which chooses again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import time
from collections import defaultdict, deque

import torch

from mmspec.core.component import DecodingComponent
from mmspec.core.runtime.measured import (
    GAP,
    PROBE_TOLERANCE,
    HeldChoices,
    MeasurementCache,
    Renewals,
    device_fingerprint,
    modules_fingerprint,
    settled,
    within,
)

logger = logging.getLogger(__name__)

CALIBRATION_TOKENS = 32  # new tokens per timed calibration call
ROUNDS = 3  # timed calibration calls per method, interleaved across the methods
MARGIN = 1.05  # a speculative method must be measured this much faster than AR to be chosen
HISTORY = 8  # runs per method that join its calibrated figure
PER_FORWARD = " tokens per forward"  # the suffix of the cached tokens per target forward of each method


class TextDecodingPolicy:
    """Chooses and learns the decoding of `decoding="auto"` calls for one pipeline (see the module docstring)."""

    def __init__(self, cache: MeasurementCache | None = None, margin: float = MARGIN,
                 calibration_tokens: int = CALIBRATION_TOKENS, check_cached: bool = True):
        """`check_cached=False` trusts the cache: cached figures are used without a probe, and a run's gap is
        reported but times nothing again."""
        self.cache = cache if cache is not None else MeasurementCache("text_methods")
        self.margin, self.calibration_tokens, self.check_cached = margin, calibration_tokens, check_cached
        self.history: dict[str, dict[str, deque]] = defaultdict(lambda: defaultdict(lambda: deque(maxlen=HISTORY)))
        self.renewals = Renewals()  # which cached timings to take again (remeasure(), a run's gap)
        self.choices: HeldChoices[tuple[str, str, float]] = HeldChoices()  # (method, reason, its figure) per key

    def reconsider(self) -> None:
        """Forget the choices made so far: the next call of each key, seeded or not, chooses again with the runs'
        figures."""
        self.choices.forget()

    def remeasure(self) -> None:
        """Time every method again on the next choice (and overwrite the cached figures)."""
        self.renewals.remeasure_all()
        self.reconsider()

    def key(self, batch_size: int, temperature: float, candidates: dict[str, DecodingComponent]) -> str:
        """What a measurement and a choice hold for: the batch size, greedy or sampled, and the candidates' settings
        (a short digest: another draft length is timed anew)."""
        configs = json.dumps({name: c.to_config() for name, c in candidates.items()}, sort_keys=True)
        digest = hashlib.sha1(configs.encode()).hexdigest()[:10]
        return f"B={batch_size} {'greedy' if temperature == 0 else 'sampled'} {digest}"

    def rates(self, pipe, prompts: list[str], candidates: dict[str, DecodingComponent],
              sampling: dict) -> tuple[dict[str, float], bool]:
        """(tokens per second per candidate, each at most AR's times its tokens per target forward; whether they
        were measured now rather than read from the cache)."""
        model_print = modules_fingerprint(pipe.measured_modules)
        device_print = device_fingerprint(pipe.target.device)
        key = self.key(len(prompts), sampling["temperature"], candidates)
        saved = None if self.renewals.due(key) else self.cache.get(model_print, device_print, key)
        wanted = set(candidates) | {name + PER_FORWARD for name in candidates}
        if saved is not None and set(saved) == wanted:
            doubt = self.doubt(pipe, prompts, candidates, sampling, saved)
            if doubt is None:
                return bounded(saved, candidates), False
            logger.warning("the cached method timings for %s %s: timing them again", key, doubt)
        parts = len(candidates) * (1 + ROUNDS)
        with pipe.status_bar(f"timing {len(candidates)} methods for batch {len(prompts)}", parts) as bar:
            measured = self.measure(pipe, prompts, candidates, sampling, ROUNDS, lambda: bar.update(1))
        self.cache.put(model_print, device_print, key, measured)
        self.renewals.measured(key)
        return bounded(measured, candidates), True

    def doubt(self, pipe, prompts: list[str], candidates: dict[str, DecodingComponent], sampling: dict,
              saved: dict[str, float]) -> str | None:
        """Why cached figures are not to be used, or None: a probe now (AR and the cached best, one round) finds
        their ratio off the cached one by more than `PROBE_TOLERANCE`."""
        if not self.check_cached:
            return None
        best = max((m for m in candidates if m != "ar"), key=saved.get, default=None)
        if best is None:
            return None
        probed = {m: candidates[m] for m in ("ar", best)}
        with pipe.status_bar(f"checking the cached timings for batch {len(prompts)}", 2 * len(probed)) as bar:
            probe = self.measure(pipe, prompts, probed, sampling, 1, lambda: bar.update(1))
        expected, found = saved[best] / saved["ar"], probe[best] / probe["ar"]
        if within(found / expected, 1 + PROBE_TOLERANCE):
            return None
        return f"disagree with a probe now ({best} {found:.2f}x AR's tokens/s, the cache says {expected:.2f}x)"

    def measure(self, pipe, prompts: list[str], candidates: dict[str, DecodingComponent], sampling: dict,
                rounds: int, tick) -> dict[str, float]:
        """Each candidate's tokens per second and tokens per target forward (`name + PER_FORWARD`): one short
        untimed call each (lazy initialisation), then `rounds` timed calls of `calibration_tokens` new tokens,
        round robin over the candidates so that a slow spell of the machine falls on every candidate alike; their
        `settled` seconds count. No progress bars inside: the caller shows its own. tick(): after each call."""
        calibration = {**sampling, "max_new_tokens": self.calibration_tokens}
        shown = dict(getattr(pipe, "_progress_bar_config", {}))
        pipe.set_progress_bar_config(**{**shown, "disable": True})
        seconds, tokens, per_forward = defaultdict(list), {}, {}
        try:
            for decoding in candidates.values():
                pipe(prompts, decoding=decoding, **{**calibration, "max_new_tokens": 4})
                tick()
            for _ in range(rounds):
                for name, decoding in candidates.items():
                    started = time.perf_counter()
                    out = pipe(prompts, decoding=decoding, generator=torch.Generator().manual_seed(0), **calibration)
                    seconds[name].append(time.perf_counter() - started)
                    tokens[name] = float(out.stats.new_tokens.sum())
                    forwards = max(1, out.stats.target_forwards - out.stats.prefill_forwards)
                    per_forward[name + PER_FORWARD] = tokens[name] / len(prompts) / forwards
                    tick()
        finally:
            pipe._progress_bar_config = shown
        return per_forward | {name: tokens[name] / settled(times) for name, times in seconds.items()}

    def choose(self, pipe, prompts: list[str], candidates: dict[str, DecodingComponent],
               sampling: dict, seeded: bool = False) -> tuple[str, str]:
        """(the name of the candidate to run, the reason for the stats table) for a call of `pipe` on `prompts`: the
        same on every call of its key, until a run far off its figure has the next call choose again — except a
        `seeded` call (one with a generator), which keeps the choice the first seeded call was given, so that its
        seed repeats its text (`HeldChoices`)."""
        key = self.key(len(prompts), sampling["temperature"], candidates)
        name, reason, _ = self.choices.get(key, seeded, lambda: self.predict(pipe, prompts, candidates, sampling))
        return name, reason

    def predict(self, pipe, prompts: list[str], candidates: dict[str, DecodingComponent],
                sampling: dict) -> tuple[str, str, float]:
        """(the fastest candidate by the calibrated figures and the runs since, now; the reason; its tokens per
        second by them)."""
        measured, now = self.rates(pipe, prompts, candidates, sampling)
        runs = self.history[self.key(len(prompts), sampling["temperature"], candidates)]
        rates = {m: statistics.fmean([rate, *runs[m]]) for m, rate in measured.items()}
        best = max((m for m in rates if m != "ar"), key=rates.get, default="ar")
        source = "measured now" if now else "cached"
        speedup = rates[best] / rates["ar"] if best != "ar" else 1.0
        if speedup >= self.margin:
            return best, (f"auto: {best}, {speedup:.2f}x AR's tokens/s here at batch {len(prompts)} "
                          f"({source}, {len(runs[best])} run(s) since)"), rates[best]
        return "ar", (f"auto: ar, no drafter pays here at batch {len(prompts)} (best: {best} "
                      f"{speedup:.2f}x < {self.margin}x; {source})"), rates["ar"]

    def record(self, key: str, name: str, new_tokens: int, seconds: float, rows: int = 1) -> str | None:
        """Fold a finished auto run's tokens per second into its candidate's figure (`key`: the call's `key()`;
        `new_tokens`: over its `rows`). A run of the choice at least `calibration_tokens` long per row whose rate
        is off its figure by more than `GAP` has every method timed again on the next call, which chooses again;
        returns the note for the run's stats then."""
        rate = new_tokens / seconds
        self.history[key][name].append(rate)
        chosen = next((held for held in self.choices.held(key) if held[0] == name), None)
        if chosen is None or new_tokens / rows < self.calibration_tokens:
            return None
        ratio = rate / chosen[2]
        if within(ratio, GAP):
            return None
        note = f"it ran at {ratio:.3g}x the tokens/s measured for {name}"
        if self.check_cached:
            self.renewals.mark_stale(key)
            self.choices.refresh()
            note += ": the methods are timed again on the next call"
        logger.warning("auto: %s", note)
        return note


def bounded(figures: dict[str, float], candidates) -> dict[str, float]:
    """Each candidate's tokens per second, at most AR's times its tokens per target forward: a speculative forward
    costs at least AR's step, so a faster figure is timing noise."""
    ar = figures["ar"]
    return {m: ar if m == "ar" else min(figures[m], ar * figures[m + PER_FORWARD]) for m in candidates}
