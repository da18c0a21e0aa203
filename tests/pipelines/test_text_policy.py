"""`decoding="auto"` of the text pipeline (mmspec.text.policy): it runs the fastest measured decoding, AR when
no drafter beats it by the margin, learns from its own runs, and reuses timings only for the models, device and
settings they were taken with."""

import pytest
import torch

from mmspec import AR, TextSpeculation
from mmspec.core.runtime.measured import MeasurementCache, device_fingerprint, modules_fingerprint
from mmspec.text.methods import AR as TextAR
from mmspec.text.methods import TextDraftHeads
from mmspec.text.policy import PER_FORWARD, ROUNDS, TextDecodingPolicy
from tests.conftest import embedded_text_pipeline

PROMPTS = ["def fibonacci(n):\n"]
SAMPLING = dict(max_new_tokens=16, temperature=0.0, top_k=0, top_p=1.0)


@pytest.fixture(scope="module")
def pipe():
    return embedded_text_pipeline()


@pytest.fixture(scope="module")
def candidates(pipe):
    return pipe.auto_candidates({})


def policy_with_rates(tmp_path, pipe, candidates, rates: dict[str, float],
                      per_forward: dict[str, float] | None = None, check_cached: bool = False) -> TextDecodingPolicy:
    """A policy whose cache holds `rates` (tokens/s) and `per_forward` (tokens per target forward, default 4 for
    each drafter) for these candidates at batch 1, greedy; by default it trusts them (no probe)."""
    cache = MeasurementCache("text_methods", tmp_path)
    policy = TextDecodingPolicy(cache=cache, check_cached=check_cached)
    per_forward = {m: 1.0 if m == "ar" else 4.0 for m in rates} | (per_forward or {})
    cache.put(modules_fingerprint(pipe.measured_modules), device_fingerprint(torch.device("cpu")),
              policy.key(1, 0.0, candidates), rates | {m + PER_FORWARD: t for m, t in per_forward.items()})
    return policy


def test_candidates_are_ar_and_the_drafters_that_read_the_settings(pipe, candidates):
    assert candidates == {"ar": TextAR(), "model": TextSpeculation(drafter="model"),
                          "ngram": TextSpeculation(drafter="ngram"), "layerskip": TextSpeculation(drafter="layerskip"),
                          "cascade": TextSpeculation(drafter="cascade"),
                          "kangaroo": TextSpeculation(drafter="kangaroo"), "s2d": TextSpeculation(drafter="s2d"),
                          "heads": TextDraftHeads(kind="eagle")}
    assert {"tree", "stand"} <= set(pipe.methods)  # named, not auto-chosen
    assert set(pipe.auto_candidates({"max_ngram": 4})) == {"ar", "ngram", "cascade"}  # prompt lookup's readers
    longer = pipe.auto_candidates({"draft_length": 6})
    assert longer["model"].draft_length == longer["heads"].draft_length == 6
    with pytest.raises(ValueError, match="name the decoding to use acceptance='typical'"):
        pipe.auto_candidates({"acceptance": "typical"})
    with pytest.raises(ValueError, match="chooses the drafter"):
        pipe.auto_candidates({"drafter": "model"})


def test_the_fastest_measured_decoding_wins_and_ar_when_none_pays(tmp_path, pipe, candidates):
    rates = {"model": 300.0, "ngram": 420.0, "layerskip": 260.0, "cascade": 290.0, "kangaroo": 270.0, "s2d": 265.0,
             "heads": 280.0, "ar": 240.0}
    policy = policy_with_rates(tmp_path / "a", pipe, candidates, rates)
    name, reason = policy.choose(pipe, PROMPTS, candidates, SAMPLING)
    assert name == "ngram" and reason.startswith("auto: ngram, 1.75x AR's tokens/s") and "cached" in reason
    slow = {"model": 230.0, "ngram": 250.0, "layerskip": 200.0, "cascade": 235.0, "kangaroo": 220.0, "s2d": 215.0,
            "heads": 245.0, "ar": 240.0}  # 1.04x < 1.05x
    name, reason = policy_with_rates(tmp_path / "b", pipe, candidates, slow).choose(pipe, PROMPTS, candidates,
                                                                                    SAMPLING)
    assert name == "ar" and "no drafter pays" in reason


def test_its_own_runs_move_the_choice(tmp_path, pipe, candidates):
    policy = policy_with_rates(tmp_path, pipe, candidates,
                               {"model": 300.0, "ngram": 420.0, "layerskip": 260.0, "cascade": 290.0, "kangaroo": 270.0,
                                "s2d": 265.0, "heads": 280.0, "ar": 240.0})
    assert policy.choose(pipe, PROMPTS, candidates, SAMPLING)[0] == "ngram"
    key = policy.key(1, 0.0, candidates)
    for _ in range(3):  # prompt lookup stops paying on the caller's text
        policy.record(key, "ngram", new_tokens=100, seconds=1.0)
    assert policy.choose(pipe, PROMPTS, candidates, SAMPLING)[0] == "ngram"  # the choice holds: same seed, same text
    policy.reconsider()
    assert policy.choose(pipe, PROMPTS, candidates, SAMPLING)[0] == "model"  # ngram: mean(420, 100, 100, 100) = 180


def test_decodings_are_timed_once_then_read_from_disk_and_not_reused_elsewhere(tmp_path, pipe, candidates):
    names = ("ar", "model", "ngram")  # three of the candidates: caching does not depend on which
    candidates = {name: candidates[name] for name in names}
    policy = TextDecodingPolicy(cache=MeasurementCache("text_methods", tmp_path), calibration_tokens=8)
    rates, measured = policy.rates(pipe, PROMPTS, candidates, SAMPLING)
    assert measured and set(rates) == set(candidates) and all(r > 0 for r in rates.values())
    again = TextDecodingPolicy(cache=MeasurementCache("text_methods", tmp_path), calibration_tokens=8,
                               check_cached=False)
    assert again.rates(pipe, PROMPTS, candidates, SAMPLING) == (rates, False)
    assert again.rates(pipe, PROMPTS * 2, candidates, SAMPLING)[1] is True  # another batch size: timed for it
    longer = {name: pipe.auto_candidates({"draft_length": 6})[name] for name in names}  # other settings: timed anew
    assert again.key(1, 0.0, longer) != again.key(1, 0.0, candidates)
    again.remeasure()
    assert again.rates(pipe, PROMPTS, candidates, SAMPLING)[1] is True
    elsewhere = {**device_fingerprint(torch.device("cpu")), "name": "another CPU"}
    other = MeasurementCache("text_methods", tmp_path / "other")
    model_print = modules_fingerprint(pipe.measured_modules)
    other.put(model_print, elsewhere, again.key(1, 0.0, candidates),
              {m: 1e9 for m in candidates} | {m + PER_FORWARD: 1.0 for m in candidates})
    assert TextDecodingPolicy(cache=other, calibration_tokens=8).rates(pipe, PROMPTS, candidates, SAMPLING)[1] is True


def test_auto_is_the_default_and_an_explicit_decoding_wins(pipe):
    default = pipe.decoding_policy
    pipe.decoding_policy = TextDecodingPolicy(calibration_tokens=8)  # short timing calls: which wins is not at stake
    try:
        out = pipe("def f(x):\n", max_new_tokens=8)
        assert out.stats.chosen_by.startswith("auto: ")
        candidates = {c.describe() for c in pipe.auto_candidates({}).values()}
        assert out.stats.method in candidates | {"AR(): transformers' generate"}
        out = pipe("def f(x):\n", decoding="ngram", max_new_tokens=8)
        assert out.stats.chosen_by is None and out.stats.method == TextSpeculation(drafter="ngram").describe()
        with pytest.raises(ValueError, match="name the decoding to use acceptance='typical'"):
            pipe("def f(x):\n", acceptance="typical")
        # greedy: whichever decoding auto runs, the completion is the target's own
        auto, ar = (pipe("def f(x):\n", max_new_tokens=12, **options).texts for options in ({}, {"decoding": AR()}))
        assert auto == ar
    finally:
        pipe.decoding_policy = default


def test_measuring_shows_a_bar_that_names_what_it_times(tmp_path, pipe, candidates, capsys):
    """First use times every candidate (seconds to minutes on a CPU): a bar says so; a cached measurement shows
    nothing."""
    policy = TextDecodingPolicy(cache=MeasurementCache("text_methods", tmp_path), calibration_tokens=8,
                                check_cached=False)
    pipe.set_progress_bar_config(disable=False)
    try:
        policy.rates(pipe, PROMPTS, candidates, SAMPLING)
        first = capsys.readouterr().err
        policy.rates(pipe, PROMPTS, candidates, SAMPLING)
        again = capsys.readouterr().err
    finally:
        pipe.set_progress_bar_config(disable=True)
    calls = len(candidates) * (1 + ROUNDS)  # a short untimed call each, then the interleaved timed rounds
    assert f"timing {len(candidates)} methods for batch 1" in first and f"{calls}/{calls}" in first
    assert "timing" not in again


def test_no_figure_exceeds_ar_s_times_its_tokens_per_forward(tmp_path, pipe, candidates):
    """A busy machine timed AR slow and prompt lookup fast (10x AR's tokens/s) while prompt lookup accepted 1.5
    tokens a forward: it is credited 1.5x at most, which the margin still lets through, and the reason says 1.50x."""
    rates = {m: 200.0 for m in candidates} | {"ar": 240.0, "ngram": 2400.0}
    policy = policy_with_rates(tmp_path, pipe, candidates, rates, per_forward={"ngram": 1.5})
    name, reason = policy.choose(pipe, PROMPTS, candidates, SAMPLING)
    assert name == "ngram" and reason.startswith("auto: ngram, 1.50x AR's tokens/s"), reason


def test_cached_timings_a_probe_disagrees_with_are_timed_again(tmp_path, pipe, caplog):
    """Figures cached on a busy machine (prompt lookup at 30x AR) are probed before use (AR and the cached best,
    one round): the probe disagrees and every method is timed again. Companion: trusted (`check_cached=False`),
    the same cache is read as it is."""
    import logging

    two = {name: c for name, c in pipe.auto_candidates({}).items() if name in ("ar", "ngram")}
    rates = {"ar": 10.0, "ngram": 300.0}
    per_forward = {"ngram": 40.0}  # not binding: the cache alone decides
    trusting = policy_with_rates(tmp_path / "trusted", pipe, two, rates, per_forward, check_cached=False)
    assert trusting.rates(pipe, PROMPTS, two, SAMPLING) == (rates, False)
    checking = policy_with_rates(tmp_path / "checked", pipe, two, rates, per_forward, check_cached=True)
    checking.calibration_tokens = 8
    with caplog.at_level(logging.WARNING, logger="mmspec.text.policy"):
        measured, now = checking.rates(pipe, PROMPTS, two, SAMPLING)
    assert now and measured != rates
    assert "the cached method timings for B=1 greedy" in caplog.text and "disagree with a probe now" in caplog.text


def test_a_chosen_run_far_off_its_figure_has_the_methods_timed_again(tmp_path, pipe):
    """A run of the choice at a third of its measured tokens/s (as long as the calibration) is noted in the stats
    and the next call times every method again; a shorter run, or one within `GAP`, changes nothing."""
    two = {name: c for name, c in pipe.auto_candidates({}).items() if name in ("ar", "ngram")}
    policy = TextDecodingPolicy(cache=MeasurementCache("text_methods", tmp_path), calibration_tokens=8)
    name, reason = policy.choose(pipe, PROMPTS, two, SAMPLING)
    assert "measured now" in reason
    key = policy.key(1, 0.0, two)
    figure = policy.choices.latest[key][2]
    assert policy.record(key, name, new_tokens=8, seconds=8 / (figure / 1.5)) is None  # within GAP
    assert policy.record(key, name, new_tokens=4, seconds=4 / (figure / 3)) is None  # shorter than the calibration
    assert policy.choose(pipe, PROMPTS, two, SAMPLING) == (name, reason)
    note = policy.record(key, name, new_tokens=8, seconds=8 / (figure / 3))
    assert note == f"it ran at 0.333x the tokens/s measured for {name}: the methods are timed again on the next call"
    assert "measured now" in policy.choose(pipe, PROMPTS, two, SAMPLING)[1]


def test_a_seeded_call_keeps_its_choice_through_a_run_far_off_until_reconsidered(tmp_path, pipe):
    """After a run far off its figure, calls without a generator time the methods again and choose anew; calls with
    one keep the choice the first of them was given (a seed repeats its text however busy the machine got), and a
    seeded run of it is still checked against its figure; `reconsider()` drops it."""
    two = {name: c for name, c in pipe.auto_candidates({}).items() if name in ("ar", "ngram")}
    policy = TextDecodingPolicy(cache=MeasurementCache("text_methods", tmp_path), calibration_tokens=8)
    first = policy.choose(pipe, PROMPTS, two, SAMPLING, seeded=True)
    key = policy.key(1, 0.0, two)
    figure = policy.choices.seeded[key][2]
    assert policy.record(key, first[0], new_tokens=8, seconds=8 / (figure / 3)) is not None
    assert policy.choose(pipe, PROMPTS, two, SAMPLING, seeded=True) == first
    assert "measured now" in policy.choose(pipe, PROMPTS, two, SAMPLING)[1]
    assert policy.choose(pipe, PROMPTS, two, SAMPLING, seeded=True) == first
    policy.choices.latest[key] = ("ar" if first[0] != "ar" else "ngram", "other", 1.0)  # the newest choice differs
    assert policy.record(key, first[0], new_tokens=8, seconds=8 / (figure / 3)) is not None  # the seeded run, checked
    policy.reconsider()
    assert "measured now" in policy.choose(pipe, PROMPTS, two, SAMPLING, seeded=True)[1]


def test_a_pipeline_takes_another_policy(pipe):
    default = pipe.decoding_policy
    try:
        pipe.decoding_policy = mine = TextDecodingPolicy(calibration_tokens=8)
        assert pipe.decoding_policy is mine
        with pytest.raises(TypeError, match="decoding_policy must be a TextDecodingPolicy, got dict"):
            pipe.decoding_policy = {}
    finally:
        pipe.decoding_policy = default
