"""The continuous benchmark runs end to end on the shipped MAR pair (tiny settings) and reports what it says."""

import json
import math

import pytest
from PIL import Image

from mmspec.eval.bench_continuous import main


@pytest.mark.slow  # a benchmark's smoke run
def test_bench_continuous_reports_passes_acceptance_speed_and_fd(tmp_path, capsys):
    out, grid = tmp_path / "bench.json", tmp_path / "grid.png"
    result = main(["--images-bs1", "1", "--images-bs8", "3", "--num-iter", "5", "--diffusion-steps", "4",
                   "--gamma", "2", "--prefill-ratio", "0.2", "--json", str(out), "--grid", str(grid)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    rows = {(r["method"], r["batch_size"]): r for r in result["rows"]}
    assert len(rows) == 10
    n_prefill = 1  # floor(5 * 0.2)
    coarsened_passes = n_prefill + math.ceil((5 - n_prefill) / 2)
    for batch_size in (1, 8):
        assert rows["ar", batch_size]["target_passes"] == 5 and rows["ar", batch_size]["speedup_vs_ar"] == 1
        assert rows["ar_coarsened", batch_size]["target_passes"] == coarsened_passes
        assert rows["draft", batch_size]["target_passes"] == 5  # the draft alone: its own passes
        for mode in ("exact", "paper"):
            row = rows[mode, batch_size]
            assert row["target_passes"] == coarsened_passes and row["draft_passes"] == 5 - n_prefill
            assert 0 <= row["acceptance_rate"] <= 1 and row["median_latency_s"] > 0
            assert result[f"{mode}_speedup_vs_target_bs{batch_size}"] == round(row["speedup_vs_ar"], 4)
    assert set(result["fd_clip"]) == {"ar", "exact", "paper", "ar_coarsened", "draft", "vae_reconstruction"}
    assert all(math.isfinite(v) and v >= 0 for v in result["fd_clip"].values())
    assert Image.open(grid).size == (2 * 64 * 6, 2 * 64 * 3)  # real + 5 methods, one row per image
    printed = capsys.readouterr().out
    assert "| exact | 1 |" in printed and "vae reconstruction (floor)" in printed
