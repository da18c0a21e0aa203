"""`mmspec.eval.calibration`: the randomized PIT of exact samples (AR, SJD, SJD with a frontier tree) under the model's
conditional laws is uniform and serially uncorrelated, a sampler that sharpens the law (temperature 0.7 read as 1)
and one that reuses its randomness across positions are caught; the command reads a sample store and refuses a folder
that is not one before any model loads."""

import json

import numpy as np
import pytest
import torch

from mmspec.core.probs import SamplingConfig
from mmspec.eval.bench_image import held_out_prompts
from mmspec.eval.calibration import main, pit_values, summary
from mmspec.eval.devices import seeded
from mmspec.eval.samples import Method, SampleStore, generate

PROMPTS = held_out_prompts(8)
SAMPLING = SamplingConfig(temperature=1.0, top_k=0, guidance_scale=3.0)


@pytest.fixture(scope="module")
def pipe(small_image_model):
    from mmspec.pipelines.auto import AutoARImagePipeline

    pipe = AutoARImagePipeline.from_pretrained(small_image_model, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def sampled(pipe, temperature: float = 1.0, **options) -> torch.Tensor:
    generators = seeded(pipe.device, range(len(PROMPTS)))
    return pipe(PROMPTS, generator=generators, output_type="latent", guidance_scale=3.0, temperature=temperature,
                **options).images


@pytest.mark.parametrize("options", [  # the tree, whose law the frontier law tests check: the slow tier
    pytest.param({"decoding": "ar"}, id="ar"), pytest.param({"decoding": "sjd", "window": 16}, id="sjd"),
    pytest.param({"decoding": "sjd", "window": 16, "tree_width": 2, "tree_depth": 2}, id="sjd-tree",
                 marks=pytest.mark.slow)])
def test_exact_samples_are_calibrated(pipe, options):
    u = pit_values(pipe, PROMPTS, sampled(pipe, **options), SAMPLING, torch.Generator().manual_seed(0))
    assert u.shape == (8, 256) and ((0 <= u) & (u <= 1)).all()
    report = summary(u)
    assert abs(report["mean_u"] - 0.5) < 4 * report["standard_error"] and report["ks_p"] > 1e-3, report
    assert abs(report["lag1_correlation"]) < 4 * report["lag1_standard_error"], report


def test_randomness_reused_across_positions_is_caught():
    """Mutation: every second draw repeats the one before. Each u is still uniform (KS passes), the joint law is
    not: the lag-1 correlation (about 0.5 here) catches it, and independent draws pass."""
    independent = np.random.default_rng(0).random((64, 256))
    reused = independent.copy()
    reused[:, 1::2] = reused[:, ::2]
    fair, broken = summary(independent), summary(reused)
    assert abs(fair["lag1_correlation"]) < 4 * fair["lag1_standard_error"], fair
    assert broken["ks_p"] > 1e-3 and broken["lag1_correlation"] > 40 * broken["lag1_standard_error"], broken


def test_a_sharpening_sampler_is_caught(pipe):
    report = summary(pit_values(pipe, PROMPTS, sampled(pipe, temperature=0.7, decoding="ar"), SAMPLING,
                                torch.Generator().manual_seed(0)))
    assert report["mean_u"] < 0.5 - 8 * report["standard_error"] and report["ks_p"] < 1e-6, report


def test_the_command_reads_a_store(pipe, small_image_model, tmp_path, capsys):
    store = SampleStore(tmp_path, PROMPTS[:4], 1, 0, {"guidance_scale": None, "temperature": 1.0, "top_k": None,
                                                      "top_p": 1.0})
    generate(pipe, store, [(Method.parse("ar"), 0)], 2, "small")
    report = main([str(tmp_path / "ar" / "set0"), "--model", small_image_model, "--json", str(tmp_path / "r.json")])
    entry = report[str(tmp_path / "ar" / "set0")]
    assert entry["images"] == 4 and entry["draws"] == 4 * 256 and 0 <= entry["ks_p"] <= 1
    assert json.loads((tmp_path / "r.json").read_text())[str(tmp_path / "ar" / "set0")] == entry
    assert "mean u" in capsys.readouterr().out


def test_a_folder_that_is_not_a_store_is_refused_before_any_model_loads(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path), "--model", "no-such-model"])
    assert exit_.value.code == 2
    assert f"{tmp_path}: not a sample-store folder" in capsys.readouterr().err
