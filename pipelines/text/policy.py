"""`decoding="auto"` of `SpeculativeTextPipeline`: the fastest exact method for the models, device, batch size and
sampling mode at hand — measured, not guessed.

Text drafters cost different things: a draft model its own forwards, layer skip a share of the target's, an EAGLE
head one decoder layer, prompt lookup nothing — but it pays only on text that repeats its context — and every
speculative step scores L + 1 positions where AR scores one, with Python bookkeeping that a small model does not hide.
Which one wins depends on the machine and the text, so the policy times each drafter the pipeline offers (and AR, the
target's own `generate`) on the caller's prompts for `CALIBRATION_TOKENS` new tokens, once per models, device, batch
size, greedy or sampled decoding and settings, keeps the tokens per second on disk
(`mmspec.core.measured.MeasurementCache`) and picks the fastest; a speculative method must beat AR by `MARGIN`, else
AR runs. The tokens per second of each run it chose then join that method's figure (the mean of the calibration and
the last runs), so a method that stops paying on the caller's text loses its place once the choice is reconsidered: a
choice holds for its batch size and sampling mode for the life of the policy (one per pipeline), so a seed gives the
same completion on every call, until `reconsider()` or `remeasure()`.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from collections import defaultdict, deque

import torch

from mmspec.core.component import DecodingComponent
from mmspec.core.measured import MeasurementCache, device_fingerprint, modules_fingerprint

CALIBRATION_TOKENS = 32  # new tokens per timed calibration call
MARGIN = 1.05  # a speculative method must be measured this much faster than AR to be chosen
HISTORY = 8  # runs per method that join its calibrated figure


class TextDecodingPolicy:
    """Chooses and learns the decoding of `decoding="auto"` calls for one pipeline (see the module docstring)."""

    def __init__(self, cache: MeasurementCache | None = None, margin: float = MARGIN,
                 calibration_tokens: int = CALIBRATION_TOKENS):
        self.cache = cache if cache is not None else MeasurementCache("text_methods")
        self.margin, self.calibration_tokens = margin, calibration_tokens
        self.history: dict[str, dict[str, deque]] = defaultdict(lambda: defaultdict(lambda: deque(maxlen=HISTORY)))
        self._remeasure, self._fresh = False, set()
        self._choices: dict[str, tuple[str, str]] = {}  # key -> the (method, reason) that holds for it

    def reconsider(self) -> None:
        """Forget the choices made so far: the next call of each key chooses again with the runs' figures."""
        self._choices = {}

    def remeasure(self) -> None:
        """Time every method again on the next choice (and overwrite the cached figures)."""
        self._remeasure, self._fresh = True, set()
        self.reconsider()

    def key(self, batch_size: int, temperature: float, candidates: dict[str, DecodingComponent]) -> str:
        """What a measurement and a choice hold for: the batch size, greedy or sampled, and the candidates' settings
        (a short digest: another draft length is timed anew)."""
        configs = json.dumps({name: c.to_config() for name, c in candidates.items()}, sort_keys=True)
        digest = hashlib.sha1(configs.encode()).hexdigest()[:10]
        return f"B={batch_size} {'greedy' if temperature == 0 else 'sampled'} {digest}"

    def rates(self, pipe, prompts: list[str], candidates: dict[str, DecodingComponent],
              sampling: dict) -> tuple[dict[str, float], bool]:
        """(tokens per second per candidate, whether they were measured now rather than read from the cache)."""
        model_print = modules_fingerprint(pipe.measured_modules)
        device_print = device_fingerprint(pipe.target.device)
        key = self.key(len(prompts), sampling["temperature"], candidates)
        saved = None if self._remeasure and key not in self._fresh else self.cache.get(model_print, device_print, key)
        if saved is not None and set(saved) == set(candidates):
            return saved, False
        with pipe.status_bar(f"timing {len(candidates)} methods for batch {len(prompts)}", len(candidates)) as bar:
            measured = {}
            for name, decoding in candidates.items():
                measured[name] = self.tokens_per_second(pipe, prompts, decoding, sampling)
                bar.update(1)
        self.cache.put(model_print, device_print, key, measured)
        self._fresh.add(key)
        return measured, True

    def tokens_per_second(self, pipe, prompts: list[str], decoding: DecodingComponent, sampling: dict) -> float:
        """One untimed call (lazy initialisation), then the new tokens per second of a timed one (no progress bars:
        the caller's call shows its own)."""
        calibration = {**sampling, "max_new_tokens": self.calibration_tokens}
        shown = dict(getattr(pipe, "_progress_bar_config", {}))
        pipe.set_progress_bar_config(**{**shown, "disable": True})
        try:
            pipe(prompts, decoding=decoding, **{**calibration, "max_new_tokens": 4})
            started = time.perf_counter()
            out = pipe(prompts, decoding=decoding, generator=torch.Generator().manual_seed(0), **calibration)
            return float(out.stats.new_tokens.sum()) / (time.perf_counter() - started)
        finally:
            pipe._progress_bar_config = shown

    def choose(self, pipe, prompts: list[str], candidates: dict[str, DecodingComponent],
               sampling: dict) -> tuple[str, str]:
        """(the name of the candidate to run, the reason for the stats table) for a call of `pipe` on `prompts`."""
        key = self.key(len(prompts), sampling["temperature"], candidates)
        if key not in self._choices:
            self._choices[key] = self.predict(pipe, prompts, candidates, sampling)
        return self._choices[key]

    def predict(self, pipe, prompts: list[str], candidates: dict[str, DecodingComponent],
                sampling: dict) -> tuple[str, str]:
        """The fastest candidate by the calibrated figures and the runs since, now."""
        measured, now = self.rates(pipe, prompts, candidates, sampling)
        runs = self.history[self.key(len(prompts), sampling["temperature"], candidates)]
        rates = {m: statistics.fmean([rate, *runs[m]]) for m, rate in measured.items()}
        best = max((m for m in rates if m != "ar"), key=rates.get, default="ar")
        source = "measured now" if now else "cached"
        speedup = rates[best] / rates["ar"] if best != "ar" else 1.0
        if speedup >= self.margin:
            return best, (f"auto: {best}, {speedup:.2f}x AR's tokens/s here at batch {len(prompts)} "
                          f"({source}, {len(runs[best])} run(s) since)")
        return "ar", (f"auto: ar, no drafter pays here at batch {len(prompts)} (best: {best} "
                      f"{speedup:.2f}x < {self.margin}x; {source})")

    def record(self, key: str, name: str, new_tokens: int, seconds: float) -> None:
        """Fold a finished auto run's tokens per second into its candidate's figure (`key`: the call's `key()`)."""
        self.history[key][name].append(new_tokens / seconds)
