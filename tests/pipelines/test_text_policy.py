"""`method="auto"` of the text pipeline (mmspec.pipelines.text.policy): it runs the fastest measured method, AR when no
drafter beats it by the margin, learns from its own runs, and reuses timings only for the models and device they were
taken on."""

import pytest
import torch

from mmspec.core.measured import MeasurementCache, device_fingerprint, modules_fingerprint
from mmspec.pipelines.text import SpeculativeTextPipeline
from mmspec.pipelines.text.policy import TextMethodPolicy
from mmspec.zoo import TEXT_DRAFT, TEXT_TARGET

PROMPTS = ["def fibonacci(n):\n"]
OPTIONS = dict(max_new_tokens=16, temperature=0.0, top_k=0, top_p=1.0, draft_length=4, schedule="constant",
               confidence_threshold=0.0, exit_layer=None, max_ngram=3)


@pytest.fixture(scope="module")
def pipe():
    return SpeculativeTextPipeline.from_pretrained(TEXT_TARGET, draft=TEXT_DRAFT)


def policy_with_rates(tmp_path, pipe, rates: dict[str, float], key: str = "B=1 greedy") -> TextMethodPolicy:
    cache = MeasurementCache("text_methods", tmp_path)
    cache.put(modules_fingerprint({"target": pipe.target, "draft": pipe.draft}), device_fingerprint(
        torch.device("cpu")), key, rates)
    return TextMethodPolicy(cache=cache)


def test_the_fastest_measured_method_wins_and_ar_when_none_pays(tmp_path, pipe):
    rates = {"model": 300.0, "ngram": 420.0, "layerskip": 260.0, "ar": 240.0}
    method, reason = policy_with_rates(tmp_path / "a", pipe, rates).choose(pipe, PROMPTS, OPTIONS)
    assert method == "ngram" and reason.startswith("auto: ngram, 1.75x AR's tokens/s") and "cached" in reason
    slow = {"model": 230.0, "ngram": 250.0, "layerskip": 200.0, "ar": 240.0}  # 1.04x: under the 1.05x margin
    method, reason = policy_with_rates(tmp_path / "b", pipe, slow).choose(pipe, PROMPTS, OPTIONS)
    assert method == "ar" and "no drafter pays" in reason


def test_its_own_runs_move_the_choice(tmp_path, pipe):
    policy = policy_with_rates(tmp_path, pipe, {"model": 300.0, "ngram": 420.0, "layerskip": 260.0, "ar": 240.0})
    assert policy.choose(pipe, PROMPTS, OPTIONS)[0] == "ngram"
    for _ in range(3):  # prompt lookup stops paying on the caller's text
        policy.record("ngram", 1, 0.0, new_tokens=100, seconds=1.0)
    assert policy.choose(pipe, PROMPTS, OPTIONS)[0] == "ngram"  # the choice holds: same seed, same text
    policy.reconsider()
    assert policy.choose(pipe, PROMPTS, OPTIONS)[0] == "model"  # ngram: mean(420, 100, 100, 100) = 180


def test_methods_are_timed_once_then_read_from_disk_and_not_reused_elsewhere(tmp_path, pipe):
    policy = TextMethodPolicy(cache=MeasurementCache("text_methods", tmp_path), calibration_tokens=8)
    rates, measured = policy.rates(pipe, PROMPTS, OPTIONS)
    assert measured and set(rates) == set(pipe.methods) and all(r > 0 for r in rates.values())
    again = TextMethodPolicy(cache=MeasurementCache("text_methods", tmp_path))
    assert again.rates(pipe, PROMPTS, OPTIONS) == (rates, False)
    assert again.rates(pipe, PROMPTS * 2, OPTIONS)[1] is True  # another batch size: timed for it
    again.remeasure()
    assert again.rates(pipe, PROMPTS, OPTIONS)[1] is True
    elsewhere = {**device_fingerprint(torch.device("cpu")), "name": "another CPU"}
    other = MeasurementCache("text_methods", tmp_path / "other")
    model_print = modules_fingerprint({"target": pipe.target, "draft": pipe.draft})
    other.put(model_print, elsewhere, "B=1 greedy", {m: 1e9 for m in pipe.methods})
    assert TextMethodPolicy(cache=other, calibration_tokens=8).rates(pipe, PROMPTS, OPTIONS)[1] is True


def test_auto_is_the_default_and_an_explicit_method_wins(pipe):
    out = pipe("def f(x):\n", max_new_tokens=8)
    assert out.stats.chosen_by.startswith("auto: ") and out.stats.method in pipe.methods
    out = pipe("def f(x):\n", method="ngram", max_new_tokens=8)
    assert out.stats.chosen_by is None and out.stats.method == "ngram"
    with pytest.raises(ValueError, match="name the method to use acceptance='typical'"):
        pipe("def f(x):\n", acceptance="typical")
    # greedy: whichever method auto runs, the completion is the target's own
    assert pipe("def f(x):\n", max_new_tokens=12).texts == pipe("def f(x):\n", method="ar", max_new_tokens=12).texts
