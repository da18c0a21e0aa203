"""The cost model's MAR and next-frame parts (`mmspec.eval.cost_mar`, `mmspec.eval.cost_video`): the projections on
numbers worked by hand, the hooks' counts on tiny models, and both sections end to end on the embedded models with
tiny real shapes."""

import pytest
import torch

from mmspec.eval import cost_mar, cost_video
from mmspec.models.mar.model import MARModel

TINY_MAR = {"seq_len": 256, "token_dim": 16, "buffer_size": 4, "encoder_embed_dim": 32, "encoder_depth": 1,
            "encoder_num_heads": 2, "decoder_embed_dim": 32, "decoder_depth": 1, "decoder_num_heads": 2,
            "diffloss_d": 1, "diffloss_w": 32}


def test_head_calls_are_interpolated_and_extrapolated_linearly_in_their_rows():
    components = {"pass_s": 2.0, "head_s": {2: 1.0, 8: 1.0, 32: 4.0}}
    log = {"passes": 3, "head_rows": [2, 5, 20, 64]}
    # rows 2 -> 1.0; 5 -> 1.0; 20 -> 1.0 + 3.0 * 12 / 24 = 2.5; 64 -> beyond 32 along the line (8, 1) - (32, 4): 8.0
    assert cost_mar.call_seconds(components, log, scale=1) == pytest.approx(3 * 2.0 + 1.0 + 1.0 + 2.5 + 8.0)
    # scale 2: rows 4, 10, 40, 128 -> 1.0, 1.25, 5.0, 16.0
    assert cost_mar.call_seconds(components, log, scale=2) == pytest.approx(6.0 + 1.0 + 1.25 + 5.0 + 16.0)


def test_the_mar_projection_on_numbers_worked_by_hand():
    def run(target_passes, draft_passes, overhead):
        return {"target": {"passes": target_passes, "head_rows": []},
                "draft": {"passes": draft_passes, "head_rows": []}, "overhead_s": overhead}

    runs = {"ar": run(64, 0, 1.0), "exact": run(8, 56, 2.0), "paper": run(8, 56, 1.0)}
    target, draft = {"pass_s": 1.0, "head_s": {2: 0.0, 8: 0.0}}, {"pass_s": 0.25, "head_s": {2: 0.0, 8: 0.0}}
    # AR 64 + 1 = 65; exact 8 + 14 + 2 = 24; paper 8 + 14 + 1 = 23
    assert cost_mar.projected_speedups(runs, target, draft, 4) == {"exact": round(65 / 24, 3),
                                                                  "paper": round(65 / 23, 3)}


def test_the_call_log_counts_encoder_decoder_passes_and_head_rows():
    torch.manual_seed(0)
    model = MARModel(**{**TINY_MAR, "seq_len": 16}).eval()
    log = cost_mar.call_log(model)
    with torch.no_grad():
        z = model.encode_decode(torch.randn(2, 16, 16), torch.rand(2, 16).argsort(1) < 8,
                                model.class_embedding(None, 2))
        model.head(torch.randn(6, 16), torch.zeros(6, dtype=torch.long), z[0, :6])
        model.head(torch.randn(3, 16), torch.zeros(3, dtype=torch.long), z[1, :3])
    logged = log.remove()
    assert (len(logged["passes"]), logged["head_rows"]) == (1, [6, 3]) and logged["inside_s"] > 0
    model.head(torch.randn(1, 16), torch.zeros(1, dtype=torch.long), z[0, :1].detach())
    assert log.calls["head_rows"] == [6, 3]  # removed: no longer counting


@pytest.mark.slow  # end to end; the projection's arithmetic: above
def test_the_mar_section_end_to_end_with_tiny_real_shapes():
    from mmspec.zoo.shapes import class_label, scenes

    labels = [class_label(caption) for caption in scenes(0, 1, "heldout")[1]]
    presets = {"mar-l": TINY_MAR, "mar-b": {**TINY_MAR, "diffloss_w": 16}}
    section = cost_mar.measure_mar(["mar-l"], torch.device("cpu"), torch.float32, (1,), labels, 1, presets=presets,
                                   settings={"num_iter": 8, "num_diffusion_steps": 5, "guidance_scale": 3.0})
    embedded = section["embedded (mar_shapes)"]
    ar, exact = embedded["runs"][1]["ar"], embedded["runs"][1]["exact"]
    assert ar["target"]["passes"] == 8 and ar["draft"]["passes"] == 0  # one pass per AR step
    assert ar["target"]["head_calls"] == 8 * 5  # one call per diffusion step of every AR step
    assert exact["draft"]["passes"] > 0 and exact["target"]["passes"] < 8
    assert set(section["mar-l"]["projected"][1]) == {"exact", "paper"} and section["mar-l"]["draft"] == "mar-b"
    assert "projected" not in section["mar-b"] and section["mar-b"]["ar_call_s"][1] > 0
    assert section["projection_relative_error"] == max(c["relative_error"] for c in embedded["check"][1].values())
    assert "| mar-l / mar-b | 1 |" in cost_mar.format_table(section)


def test_the_video_projection_on_numbers_worked_by_hand():
    runs = {"sequential": {"frames": [1] * 10, "overhead_s": 0.5}, "spec4": {"frames": [4] * 3, "overhead_s": 0.2}}
    # sequential: 10 x 100 ms + 0.5 s = 1.5 s; spec4: 3 x 250 ms + 0.2 s = 0.95 s
    assert cost_video.projected_speedups(runs, {1: 100.0, 4: 250.0}) == {"sequential": 1.0,
                                                                        "spec4": round(1.5 / 0.95, 3)}


@pytest.mark.slow  # end to end; the projection's arithmetic: above
def test_the_video_section_end_to_end_with_a_tiny_real_shape():
    tiny = {"latent_channels": 4, "latent_size": 4, "num_actions": 5, "dim": 32, "depth": 1, "num_heads": 2,
            "attention_window": 3}
    section = cost_video.measure_video([], torch.device("cpu"), torch.float32, 1, 8, 1, shapes={"tiny": tiny})
    forwards = section["embedded (nextframe_shapes)"]["forwards"]
    assert set(forwards["sequential"]) == {1}  # one frame per forward
    assert max(forwards["spec4"]) == 4  # blocks of four
    entry = section["tiny"]
    assert set(entry["forward_ms"]) == {n for counts in forwards.values() for n in counts}
    assert entry["projected"]["sequential"] == 1.0 and set(entry["projected"]) == set(cost_video.METHODS)
