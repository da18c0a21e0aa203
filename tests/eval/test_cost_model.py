"""`mmspec.eval.cost_model`: the projection formula on numbers worked by hand, the real shapes' sizes, the skip of a
model that does not fit, and clear errors. The whole script runs in tests/eval/test_gpu_suite.py."""

import pytest
import torch

from mmspec.eval import cost_model
from mmspec.eval.cost_model import measure_real_shape, projected_speedups
from mmspec.eval.real_shapes import REAL_SHAPES, Emu3Shape, JanusShape, LlamaGenShape, LuminaShape


def embedded_runs(ar_overhead: float = 0.0, overhead: float = 0.0) -> dict:
    run = {"overhead_s": overhead}
    return {"ar": {"overhead_s": ar_overhead},
            "sjd": {2: {"compression": 2.0, **run}, 4: {"compression": 3.0, **run}},
            "mc_sjd": {2: {"compression": 1.8, **run}, 4: {"compression": 4.0, **run}},
            "lantern": {4: {"compression": 5.0, **run}},
            "draft": {2: {"compression": 1.5, **run}, 3: {"compression": 2.0, **run}},
            "heads": {2: {"compression": 1.8, **run}, 3: {"compression": 2.8, **run}}}


STEPS = {"draft": 0.5, "heads": 0.25}  # seconds of one call of each drafter


def test_the_projection_on_numbers_worked_by_hand():
    curve = {1: 1.0, 2: 1.0, 3: 1.5, 4: 2.0}  # seconds of a W-token forward
    projected = projected_speedups(curve, draft_steps=STEPS, embedded=embedded_runs())
    assert projected["ar"] == {"window": 1, "speedup": 1.0}
    assert projected["sjd"] == {"window": 2, "speedup": 2.0}  # 2.0 / 1.0 beats 3.0 / 2.0
    assert projected["mc_sjd"] == {"window": 4, "speedup": 2.0}  # 4.0 / 2.0 beats 1.8 / 1.0
    assert projected["lantern"] == {"window": 4, "speedup": 2.5}
    # the draft path pays its drafter: W = 2: 1.5 / (1.0 + 0.5) = 1.0; W = 3: 2.0 / (1.5 + 2 * 0.5) = 0.8
    assert projected["draft"] == {"window": 2, "speedup": 1.0}
    # the head path pays its cheaper head: W = 2: 1.8 / (1.0 + 0.25) = 1.44; W = 3: 2.8 / (1.5 + 2 * 0.25) = 1.4
    assert projected["heads"] == {"window": 2, "speedup": 1.44}


def test_overhead_outside_the_forward_counts_per_forward():
    curve = {1: 1.0, 2: 1.0, 3: 1.5, 4: 2.0}
    projected = projected_speedups(curve, STEPS, embedded_runs(ar_overhead=0.5, overhead=1.0))
    # sjd W = 2: 2.0 * (1.0 + 0.5) / (1.0 + 1.0) = 1.5; W = 4: 3.0 * 1.5 / 3.0 = 1.5 -> the first best
    assert projected["sjd"]["speedup"] == 1.5
    assert projected["lantern"]["speedup"] == 2.5  # 5.0 * 1.5 / 3.0


def test_windows_without_a_measured_cost_are_not_projected():
    projected = projected_speedups({1: 1.0, 2: 1.0, 4: 4.0}, STEPS, embedded_runs())
    assert projected["sjd"]["window"] == 2 and projected["draft"]["window"] == 2  # draft W = 3 has no cost


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
    assert entry["skipped"] == "needs about 2.4 GiB, 1.0 GiB free on cpu"  # 343 M + a 1-layer drafter + cache, fp32


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


def test_janus_pro_is_measured_through_its_adapter_at_a_tiny_size():
    tiny = JanusShape.tiny(4)
    entry = measure_real_shape("janus-tiny", tiny, torch.device("cpu"), torch.float32, (1, 2), (1, 2, 4), repeats=1)
    assert set(entry["cost_curve"][2]) == {1, 2, 3, 4, 5} and entry["cost_curve"][2][1] == 1.0
    assert entry["parameters"] == tiny.parameters() > tiny.parameters(1)
    assert tiny.image_tokens == 16


@pytest.mark.parametrize("tiny", [
    Emu3Shape(32, 37, 2, 4, 2, 200, 3, 4, 20, context=6),
    LuminaShape(32, 37, 2, 4, 2, 200, 2, 4, 16, context=6),
], ids=["emu3", "lumina-mgpt"])
def test_line_structured_families_are_measured_through_their_adapters_at_a_tiny_size(tiny):
    entry = measure_real_shape("tiny", tiny, torch.device("cpu"), torch.float32, (2,), (1, 2, 4), repeats=1)
    assert set(entry["cost_curve"][2]) == {1, 2, 3, 4, 5} and entry["cost_curve"][2][1] == 1.0
    assert entry["draft_step_seconds"][2] > 0
    assert tiny.image_tokens == tiny.height * (tiny.width + 1)  # every row closed by its line token
    assert tiny.kv_width == 16  # 2 of 4 heads of width 8


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
