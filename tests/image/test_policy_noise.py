"""`decoding="auto"` on a busy machine: a simulated one whose clock moves only when the model computes, by a known
cost per forward width, disturbed by outliers and a slow spell. The choice must stay within 10 % of the best
decoding's true time wherever the spell falls; an impossible or a wrong cached curve is detected and measured again;
a run slower than predicted refreshes the curve for the next call. Mutation companions: a policy that averages its
rounds, or that trusts its cache, is misled by the same machine."""

import logging
import statistics

import pytest
import torch

import mmspec.image.policy as policy_module
from mmspec.core.probs import SamplingConfig
from mmspec.core.runtime.measured import MeasurementCache, device_fingerprint
from mmspec.core.stats import SpecStats
from mmspec.image.policy import DecodingPolicy, model_fingerprint
from mmspec.models.llamagen.adapter import LlamaGenAdapter
from tests.image.test_policy import PRIOR, put_curve

CFG = SamplingConfig(guidance_scale=3.0)
WINDOWS = (2, 4, 8, 16, 32)
N = 256  # image tokens of the test model (16 x 16)
PREFILL = 2.0  # simulated seconds of a prefill


def cost(width: int) -> float:
    """True simulated seconds of a forward of `width` tokens: compute-bound, each token a tenth of AR's step more."""
    return 1.0 + 0.1 * (width - 1)


def true_seconds(window: int) -> float:
    """What an image really takes with SJD at `window` (1: AR) on the simulated machine, at the prior's compression."""
    compression = 1.0 if window == 1 else PRIOR[1][window]
    return PREFILL + N / compression * cost(window)


BEST = min(true_seconds(W) for W in (1, *WINDOWS))  # window 4: 168.4 s; window 8 within 1 %, AR 258 s


class Machine:
    """A clock (call it for the seconds) that the model advances: each forward by `cost(width)`, each prefill by
    `PREFILL`, times the disturbance at that call: every `outlier_every`-th call 10x (another job's burst), and the
    calls in `spell` 4x (a build running meanwhile)."""

    def __init__(self, spell: range = range(0), outlier_every: int = 0):
        self.now, self.calls, self.spell, self.outlier_every = 0.0, 0, spell, outlier_every

    def __call__(self) -> float:
        return self.now

    def compute(self, seconds: float) -> None:
        factor = 4.0 if self.calls in self.spell else 1.0
        if self.outlier_every and self.calls % self.outlier_every == self.outlier_every - 1:
            factor *= 10.0
        self.now += seconds * factor
        self.calls += 1


class SimulatedAdapter(LlamaGenAdapter):
    """The test model, whose forwards and prefills advance `machine`'s clock by their true simulated cost."""

    def __init__(self, transformer, vqvae, machine: Machine):
        super().__init__(transformer, vqvae)
        self.machine = machine

    def prefill(self, condition, cfg, max_window=1):
        self.machine.compute(PREFILL)
        return super().prefill(condition, cfg, max_window)

    def forward(self, tokens, state):
        self.machine.compute(cost(tokens.shape[1]))
        return super().forward(tokens, state)


@pytest.fixture(scope="module")
def pipe(small_image_model):
    from mmspec.pipelines.llamagen import LlamaGenPipeline

    pipe = LlamaGenPipeline.from_pretrained(small_image_model, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def condition(pipe):
    return pipe.encode_prompt(["a red circle"])


def choose(pipe, condition, machine: Machine, folder, cache_filled_by=None):
    """(the choice, the policy, the model) of a policy timing on `machine`, its cache in `folder`."""
    adapter = SimulatedAdapter(pipe.transformer, pipe.vqvae, machine)
    cache = MeasurementCache("cost_curves", folder)
    if cache_filled_by is not None:
        cache_filled_by(cache, adapter)
    policy = DecodingPolicy(cache=cache, prior=PRIOR, windows=WINDOWS, tree_prior={}, clock=machine)
    return policy.choose(adapter, condition, 1, CFG), policy, adapter


def chosen_window(choice) -> int:
    return choice.window if choice.candidate is not None else 1


def test_a_quiet_simulated_machine_gets_the_best_decoding(pipe, condition, tmp_path):
    """The check on the check: on the undisturbed machine the choice is the best one (window 4), its measured
    curve is the true one, and the prediction is the true speedup."""
    choice, policy, adapter = choose(pipe, condition, Machine(), tmp_path)
    assert chosen_window(choice) == 4, choice.reason
    curve, _ = policy.cost_curve(adapter, condition, 1, CFG)
    assert curve == pytest.approx({W: cost(W) for W in (1, *WINDOWS)})
    assert choice.predicted_speedup == pytest.approx(true_seconds(1) / true_seconds(4))


def calls_of_a_quiet_choice(pipe, condition, folder) -> int:
    machine = Machine()
    choose(pipe, condition, machine, folder)
    return machine.calls


@pytest.mark.parametrize("where", [  # the default tier: a spell at the start, the middle and the end
    where if where in (0.0, 0.45, 0.9) else pytest.param(where, marks=pytest.mark.slow)
    for where in (0.0, 0.15, 0.3, 0.45, 0.6, 0.75, 0.9)])
def test_outliers_and_a_slow_spell_anywhere_leave_the_choice_within_10_percent(pipe, condition, tmp_path, where):
    """Outliers on every 7th forward and a spell of a fifth of the measurement at 4x, starting at `where` of it:
    the choice's true time is within 10 % of the best's, and no prediction exceeds the choice's tokens per
    forward."""
    total = calls_of_a_quiet_choice(pipe, condition, tmp_path / "quiet")
    start = int(where * total)
    machine = Machine(spell=range(start, start + total // 5), outlier_every=7)
    choice, policy, _ = choose(pipe, condition, machine, tmp_path / "busy")
    window = chosen_window(choice)
    assert true_seconds(window) <= 1.1 * BEST, (window, choice.reason)
    assert choice.predicted_speedup <= (policy.compression(window, 1) if window > 1 else 1.0) + 1e-9


def test_companion_a_policy_that_averages_its_rounds_is_misled(pipe, condition, tmp_path, monkeypatch):
    """The same machines, the rounds' mean instead of their lower quartile: some spell misleads the choice (else
    the test above could not tell a robust policy from a naive one)."""
    monkeypatch.setattr(policy_module, "settled", statistics.fmean)
    total = calls_of_a_quiet_choice(pipe, condition, tmp_path / "quiet")
    misled = []
    for where in (0.0, 0.15, 0.3, 0.45, 0.6, 0.75, 0.9):
        start = int(where * total)
        machine = Machine(spell=range(start, start + total // 5), outlier_every=7)
        choice, _, _ = choose(pipe, condition, machine, tmp_path / f"busy{where}")
        misled.append(true_seconds(chosen_window(choice)) > 1.1 * BEST)
    assert any(misled)


def poisoned(cache, adapter) -> None:
    """A curve timed while the machine was busy (10x, then 20x), quiet for window 2 alone: window 2 at a tenth of
    window 1."""
    put_curve(cache, adapter, {W: 20 * cost(W) for W in WINDOWS} | {1: 10 * cost(1), 2: cost(2)})


def flat(cache, adapter) -> None:
    """A possible curve from another kind of machine (a GPU's: a window costs what a token costs)."""
    put_curve(cache, adapter, {W: 1.0 + 0.01 * W for W in (1, *WINDOWS)})


@pytest.mark.parametrize("cached", [poisoned, flat])
def test_a_poisoned_or_foreign_cached_curve_is_detected_and_measured_again(pipe, condition, tmp_path, caplog, cached):
    with caplog.at_level(logging.WARNING, logger="mmspec.image.policy"):
        choice, policy, adapter = choose(pipe, condition, Machine(outlier_every=7), tmp_path, cache_filled_by=cached)
    reason = "is impossible" if cached is poisoned else "disagrees with a probe now"
    assert f"the cached cost curve for B=1 cfg {reason}" in caplog.text
    assert "measured now" in choice.reason and true_seconds(chosen_window(choice)) <= 1.1 * BEST, choice.reason
    saved = policy.cache.get(model_fingerprint(adapter), device_fingerprint(torch.device("cpu")), "B=1 cfg")
    assert {int(W): s for W, s in saved.items()} == pytest.approx({W: cost(W) for W in (1, *WINDOWS)})


@pytest.mark.parametrize("cached", [poisoned, flat])
def test_companion_a_policy_that_trusts_its_cache_is_misled(pipe, condition, tmp_path, cached):
    """Without the checks (`check_cached=False`, and the poisoned curve let through as possible), the cached
    curve decides, wrongly: so the test above sees the checks at work."""
    adapter = SimulatedAdapter(pipe.transformer, pipe.vqvae, Machine())
    cache = MeasurementCache("cost_curves", tmp_path)
    cached(cache, adapter)
    policy = DecodingPolicy(cache=cache, prior=PRIOR, windows=WINDOWS, tree_prior={}, clock=adapter.machine,
                            check_cached=False)
    if cached is poisoned:
        policy_module_consistent = policy_module.consistent
        policy_module.consistent = lambda curve, noise=policy_module.NOISE: True
        try:
            choice = policy.choose(adapter, condition, 1, CFG)
        finally:
            policy_module.consistent = policy_module_consistent
    else:
        choice = policy.choose(adapter, condition, 1, CFG)
    assert "cached" in choice.reason and true_seconds(chosen_window(choice)) > 1.1 * BEST, choice.reason


def test_a_run_far_slower_than_predicted_refreshes_the_curve_for_the_next_call(pipe, condition, tmp_path):
    """A run whose iterations take 3x the predicted time (the machine got busy after the curve was timed) is noted
    in its stats and the next call measures the curve again and chooses anew; a run within `GAP` changes nothing."""
    choice, policy, adapter = choose(pipe, condition, Machine(), tmp_path)
    iterations = round(N / PRIOR[1][4])

    def ran(slower: float) -> SpecStats:
        seconds = choice.prefill_seconds + iterations * choice.iteration_seconds * slower
        return SpecStats(target_forwards=1 + iterations, prefill_forwards=1, new_tokens=torch.tensor([N]),
                         timings={"total": seconds})

    assert policy.record(choice, 1, CFG, ran(1.3)) is None
    assert policy.choose(adapter, condition, 1, CFG) is choice  # the choice holds
    note = policy.record(choice, 1, CFG, ran(3.0))
    assert note == (f"its iterations took 3x the predicted {choice.iteration_seconds * 1e3:.3g} ms: the cost curve "
                    "for batch 1 is measured again on the next call")
    again = policy.choose(adapter, condition, 1, CFG)
    assert again is not choice and "measured now" in again.reason


def test_a_seeded_call_keeps_its_choice_through_a_run_far_off_until_reconsidered(pipe, condition, tmp_path):
    """A run far off its prediction has calls without a generator choose again, but calls with one keep the choice
    the first of them was given (a seed repeats its image however busy the machine got); `reconsider()` drops it."""
    choice, policy, adapter = choose(pipe, condition, Machine(), tmp_path)
    assert policy.choose(adapter, condition, 1, CFG, seeded=True) is choice
    iterations = round(N / PRIOR[1][4])
    slow = SpecStats(target_forwards=1 + iterations, prefill_forwards=1, new_tokens=torch.tensor([N]),
                     timings={"total": choice.prefill_seconds + 3 * iterations * choice.iteration_seconds})
    assert policy.record(choice, 1, CFG, slow) is not None
    assert policy.choose(adapter, condition, 1, CFG, seeded=True) is choice
    unseeded = policy.choose(adapter, condition, 1, CFG)
    assert unseeded is not choice and "measured now" in unseeded.reason
    assert policy.choose(adapter, condition, 1, CFG, seeded=True) is choice
    policy.reconsider()
    assert policy.choose(adapter, condition, 1, CFG, seeded=True) is not choice
