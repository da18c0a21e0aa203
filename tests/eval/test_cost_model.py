"""`mmspec.eval.cost_model`: the projection formula on numbers worked by hand, the real shapes' sizes, the skip of a
model that does not fit, every method's step timed on each family's adapters (eager and captured), and clear errors.
The whole script runs in tests/eval/test_gpu_suite.py."""

import pytest
import torch

from mmspec.eval import cost_model
from mmspec.eval.cost_model import measure_real_shape, projected_speedups
from mmspec.eval.real_shapes import REAL_SHAPES, Emu3Shape, JanusShape, LlamaGenShape, LuminaShape
from mmspec.models.hf_image import SlotCacheFamily


def embedded_runs() -> dict:
    return {"sjd": {2: {"compression": 2.0}, 4: {"compression": 3.0}},
            "mc_sjd": {2: {"compression": 1.8}, 4: {"compression": 4.0}},
            "lantern": {4: {"compression": 5.0}},
            "draft": {2: {"compression": 1.5}, 3: {"compression": 2.0}},
            "heads": {2: {"compression": 1.8}, 3: {"compression": 2.8}}}


def iterations(ar: float = 1.0) -> dict:
    """Seconds of one iteration: AR's and every method's at its windows."""
    return {"ar": ar, "sjd": {2: 1.0, 4: 2.0}, "mc_sjd": {2: 1.0, 4: 2.0}, "lantern": {4: 2.0},
            "draft": {2: 1.5, 3: 2.5}, "heads": {2: 1.25, 3: 2.0}}


def test_the_projection_on_numbers_worked_by_hand():
    projected = projected_speedups(iterations(), 0.0, 12, embedded_runs())
    assert projected["ar"] == {"window": 1, "speedup": 1.0}
    assert projected["sjd"] == {"window": 2, "speedup": 2.0}  # 2.0 / 1.0 beats 3.0 / 2.0
    assert projected["mc_sjd"] == {"window": 4, "speedup": 2.0}  # 4.0 / 2.0 beats 1.8 / 1.0
    assert projected["lantern"] == {"window": 4, "speedup": 2.5}
    assert projected["draft"] == {"window": 2, "speedup": 1.0}  # 1.5 / 1.5 beats 2.0 / 2.5
    assert projected["heads"] == {"window": 2, "speedup": 1.44}  # 1.8 / 1.25 beats 2.8 / 2.0


def test_ar_s_iteration_is_the_unit_of_every_speedup():
    projected = projected_speedups(iterations(ar=1.5), 0.0, 12, embedded_runs())
    assert projected["sjd"]["speedup"] == 3.0  # 2.0 * 1.5 / 1.0
    assert projected["lantern"]["speedup"] == 3.75  # 5.0 * 1.5 / 2.0


def test_the_prefill_every_decoding_pays_is_counted():
    projected = projected_speedups(iterations(), 6.0, 12, embedded_runs())
    assert projected["sjd"]["speedup"] == 1.5  # (6 + 12 * 1) / (6 + 12 / 2 * 1)
    assert projected["lantern"]["speedup"] == round(18 / (6 + 12 / 5 * 2), 3)


def test_windows_without_a_measured_iteration_are_not_projected():
    timed = iterations() | {"sjd": {2: 1.0}, "draft": {2: 1.5}}
    projected = projected_speedups(timed, 0.0, 12, embedded_runs())
    assert projected["sjd"] == {"window": 2, "speedup": 2.0} and projected["draft"]["window"] == 2


def test_the_real_shapes_have_the_official_sizes():
    # LlamaGen's paper: GPT-B 111M, GPT-L 343M, GPT-XL 775M parameters (c2i)
    millions = {name: shape.parameters() / 1e6 for name, shape in REAL_SHAPES.items()}
    assert 105 < millions["llamagen-b"] < 115
    assert 335 < millions["llamagen-l"] < 350
    assert 760 < millions["llamagen-xl"] < 790
    assert REAL_SHAPES["llamagen-xl"].config["grid_size"] == 24  # 384 px with the ds16 tokenizer


def test_a_model_that_does_not_fit_is_skipped_with_a_line(monkeypatch):
    monkeypatch.setattr(cost_model, "available_bytes", lambda device: 2**30)
    entry = measure_real_shape("llamagen-l", LlamaGenShape("GPT-L", 256), torch.device("cpu"), torch.float32,
                               (1, 8), (1, 64), repeats=1)
    assert set(entry) == {"skipped"}
    # 343 M + a 1-layer drafter + a head counted as one + the cache, fp32
    assert entry["skipped"] == "needs about 2.6 GiB, 1.0 GiB free on cpu"


@pytest.mark.parametrize(("argv", "message"), [
    (["--windows", "2", "4"], "--windows must be positive and include 1, got [2, 4]"),
    (["--batch-sizes", "0"], "--batch-sizes must be positive, got [0]"),
    (["--batch-sizes", "4", "--prompts", "2"], "--prompts must be at least the largest batch size (4), got 2"),
    (["--models", "llamagen-z"], "argument --models: invalid choice: 'llamagen-z'"),
])
def test_bad_arguments_fail_before_any_model_loads(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        cost_model.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


@pytest.fixture
def small_lantern(monkeypatch):
    """LANTERN relaxing among 5 neighbours: the tiny VQs have 12 to 20 codes (the real ones' k is 100)."""
    monkeypatch.setitem(cost_model.METHODS, "lantern", lambda W: {"decoding": "sjd", "window": W,
                                                                   "acceptance": "lantern", "lantern_k": 5})


TINY = {"janus": JanusShape.tiny(4), "emu3": Emu3Shape(32, 37, 2, 4, 2, 200, 3, 4, 20, context=6),
        "lumina-mgpt": LuminaShape(32, 37, 2, 4, 2, 200, 2, 4, 16, context=6)}


# every family eager; captured, Emu3 (forced tokens inside the step) in the default tier, the others in the slow tier
@pytest.mark.parametrize("family,captured", [
    pytest.param(family, captured, id=f"{family}-{'captured' if captured else 'eager'}",
                 marks=pytest.mark.slow if captured and family != "emu3" else ())
    for family in TINY for captured in (False, True)])
def test_every_method_s_step_is_timed_on_the_family_s_adapters(family, captured, small_lantern):
    tiny = TINY[family]
    entry = measure_real_shape(family, tiny, torch.device("cpu"), torch.float32, (2,), (1, 2, 4), repeats=1,
                               captured=captured)
    seconds = entry["iteration_seconds"][2]
    assert seconds["ar"] > 0
    assert {method: set(by_window) for method, by_window in seconds.items() if method != "ar"} == {
        "sjd": {2, 4}, "mc_sjd": {2, 4}, "lantern": {2, 4}, "draft": {2, 3, 5}, "heads": {2, 3, 5}}
    assert all(s > 0 for by_window in list(seconds.values())[1:] for s in by_window.values())
    assert set(entry["cost_curve"][2]) == {1, 2, 3, 4, 5} and entry["cost_curve"][2][1] == 1.0
    assert entry["prefill_seconds"][2] > 0 and entry["image_tokens"] == tiny.image_tokens
    assert entry["parameters"] == tiny.parameters() > tiny.parameters(1)


@pytest.mark.parametrize("captured", [False, True], ids=["eager", "captured"])
def test_the_adapters_are_the_pipelines(captured):
    """Captured: the target and the drafter on the slot cache with step graphs (their CPU tape here); the head's
    adapter eager, its head an EAGLE layer at the target's width."""
    adapters = TINY["emu3"].build(torch.device("cpu"), torch.float32, captured)
    for adapter in (adapters.target, adapters.drafter):
        assert isinstance(adapter, SlotCacheFamily) == captured
        assert (getattr(adapter, "graphs", None) is not None) == captured
    assert not isinstance(adapters.eager, SlotCacheFamily)
    assert adapters.head.config.feature_size == 32 and adapters.head.config.ffn_hidden == 37
    assert adapters.head.config.vocab_size == adapters.eager.vocab_size


def test_a_llamagen_shape_captures_on_its_window_graphs():
    shape = LlamaGenShape("GPT-B", 256)
    with torch.device("meta"):
        model = shape.model(1)
    adapter = shape.captured(model, cuda=False)
    assert adapter.graphs is not None and adapter.graphs.transformer is model and not adapter.graphs.capture
    head = shape.head(model, 16384)
    assert head.config.positions == "2d" and head.config.grid_size == 16 and head.config.feature_size == 768


def test_the_tiny_shapes_sizes():
    assert TINY["janus"].image_tokens == 16
    emu3 = TINY["emu3"]
    assert emu3.image_tokens == emu3.height * (emu3.width + 1)  # every row closed by its line token
    assert emu3.kv_width == 16  # 2 of 4 heads of width 8


def test_the_janus_pro_shapes_are_the_releases():
    # the releases' language models are DeepSeek-LLM 1.5 B (24 x 2048) and 7 B (30 x 4096), vocabulary 102,400;
    # with the SigLIP encoder, the VQ and the generation head about 1.9 B and 7.0 B in all
    for name, billions in (("janus-pro-1b", (1.8, 2.0)), ("janus-pro-7b", (6.9, 7.1))):
        assert billions[0] < REAL_SHAPES[name].parameters() / 1e9 < billions[1], name


def test_the_emu3_and_lumina_mgpt_shapes_are_the_releases():
    # Emu3-Gen: 8.49 B with its 184,622-token vocabulary (untied head); Lumina-mGPT-7B: Chameleon-7B, 7.0 B
    for name, billions, tokens in (("emu3-8b", (8.4, 8.6), 90 * 91), ("lumina-mgpt-7b", (6.9, 7.1), 48 * 49)):
        assert REAL_SHAPES[name].image_tokens == tokens, name
        assert billions[0] < REAL_SHAPES[name].parameters() / 1e9 < billions[1], name
