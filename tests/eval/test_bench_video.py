"""The video benchmark runs end to end on the shipped next-frame model (tiny settings) and reports what it says."""

import json
import math

import pytest
from PIL import Image

from mmspec.eval.bench_video import main


@pytest.mark.slow  # a benchmark's smoke run
def test_bench_video_reports_fps_accounting_and_quality(tmp_path, capsys):
    out, plot, strip = tmp_path / "bench.json", tmp_path / "plot.png", tmp_path / "strip.png"
    frames, steps = 6, 2
    result = main(["--episodes", "1", "--frames", str(frames), "--steps", str(steps), "--change-probs", "0", "0.1",
                   "--json", str(out), "--plot", str(plot), "--strip", str(strip)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    rows = {(r["method"], r["change_prob"]): r for r in result["rows"]}
    assert len(rows) == 10
    for p in (0.0, 0.1):
        # the context pass of the start frame, then per frame: the Euler steps and (sequential) one context pass
        assert rows["sequential", p]["forwards_per_frame"] == (1 + frames * (steps + 1)) / frames
        assert rows["strict", p]["forwards_per_frame"] == (1 + frames * steps) / frames
        assert rows["sequential", p]["speedup_vs_sequential"] == 1 and rows["strict", p]["speedup_vs_strict"] == 1
        for row in (rows[m, p] for m in ("sequential", "strict", "spec4", "spec4_pipe", "adaptive")):
            assert row["model_fps"] > row["fps"] > 0 and row["decode_ms_per_frame"] > 0
            assert math.isfinite(row["psnr_db"])
            assert -1 <= row["ssim"] <= 1
    assert rows["spec4", 0.0]["frames_discarded"] == 2 and rows["spec4", 0.0]["rollbacks"] == 0  # 6 = 4 + 2 (of 4)
    assert rows["spec4", 0.0]["forwards_per_frame"] == (1 + 2 * (steps + 1)) / frames
    assert result["speedup_at_change_rate_0"] == round(rows["spec4_pipe", 0.0]["speedup_vs_strict"], 4)
    curves = result["psnr_per_frame_at_change_0.1"]
    assert set(curves) == {"sequential", "strict", "spec4", "spec4_pipe", "adaptive"}
    assert set(result["pass_ms_by_frames"]) == {1, 2, 4, 8}
    assert all(len(curve) == frames for curve in curves.values())
    assert Image.open(plot).size[0] > 0
    assert Image.open(strip).size == (2 * 32 * frames, 2 * 32 * 6)  # ground truth + 5 methods, a frame per column
    assert "| spec4 | 0.1 |" in capsys.readouterr().out
