import pytest
import torch

from mmspec import AR, ContinuousSpeculation
from mmspec.continuous.mar_decoding import coarsen, cosine_plan
from mmspec.models.mar import KLAutoencoder, MARModel
from mmspec.pipelines.mar import MARPipeline
from tests.models.test_mar import TINY


@pytest.fixture(scope="module")
def pipe():
    torch.manual_seed(0)
    target, draft = MARModel(**TINY), MARModel(**{**TINY, "encoder_depth": 1, "decoder_depth": 1})
    vae = KLAutoencoder(embed_dim=4, ch=32, ch_mult=(1, 2, 2), num_res_blocks=1, encoder_attn_resolutions=(),
                        resolution=16)
    return MARPipeline(target, vae, draft)


CALL = dict(num_iter=4, num_diffusion_steps=5)


def test_outputs_and_per_image_seeds(pipe):
    out = pipe([1, 2], generator=[torch.Generator().manual_seed(s) for s in (3, 4)], output_type="latent", **CALL)
    assert out.images.shape == (2, 16, 4) and out.stats.target_forwards == 4
    alone = pipe(2, generator=torch.Generator().manual_seed(4), output_type="latent", **CALL).images
    # an image depends on its own generator only (up to batch-size float rounding of the random-weight MAR)
    assert torch.allclose(alone[0], out.images[1], rtol=1e-4, atol=1e-2)
    images = pipe([1, 2], generator=torch.Generator().manual_seed(0), **CALL).images
    assert len(images) == 2 and images[0].size == (16, 16)
    array = pipe([1], generator=torch.Generator().manual_seed(0), output_type="np", **CALL).images
    assert array.shape == (1, 16, 16, 3)


@pytest.mark.parametrize("acceptance", ["exact", "paper"])
def test_speculative_decoding_counts_its_passes(pipe, acceptance):
    out = pipe([0, 5, 9], decoding="speculative", gamma=2, prefill_ratio=0.25, acceptance=acceptance,
               generator=torch.Generator().manual_seed(1), output_type="latent", **CALL)
    assert out.stats.target_forwards == 1 + 2 and out.stats.draft_forwards == 3
    assert out.stats.drafted == 3 * (16 - cosine_plan(16, 4)[0]) and torch.isfinite(out.images).all()


@pytest.mark.parametrize("decoding", [AR(), ContinuousSpeculation(gamma=1)])
def test_step_callback_sees_each_target_pass_and_can_stop(pipe, decoding):
    """After every target pass the callback sees the tokens known so far (the full run's, zeros elsewhere); an
    interrupt keeps what is known and counts it."""
    call = dict(decoding=decoding, output_type="latent", **CALL)
    full = pipe([1, 2], generator=torch.Generator().manual_seed(2), **call).images
    seen = []

    def callback(p, step, n_known, tensors):
        latents, known = tensors["latents"], tensors["known"]
        assert known.sum(1).tolist() == [n_known, n_known]
        assert torch.equal(latents[known], full[known]) and (latents[~known] == 0).all()
        seen.append(n_known)
        p._interrupt = len(seen) == 2

    out = pipe([1, 2], generator=torch.Generator().manual_seed(2), callback_on_step_end=callback,
               callback_on_step_end_tensor_inputs=["latents", "known"], **call)
    assert len(seen) == 2 and 0 < seen[0] < seen[1] < 16 and out.stats.new_tokens.tolist() == [seen[1]] * 2
    assert (out.images.abs().sum(-1) > 0).sum(1).tolist() == [seen[1]] * 2  # the unknown tokens stayed zero
    with pytest.raises(ValueError, match="read-only"):
        pipe([1], callback_on_step_end=lambda p, s, n, t: {"latents": t["latents"] + 1}, **CALL)


def test_ar_on_a_given_plan(pipe):
    """`plan` runs the target on any schedule, e.g. the coarsened one that the exact speculative mode samples."""
    plan = coarsen(cosine_plan(16, 4), 1, 2)
    out = pipe([1, 2], plan=plan, generator=torch.Generator().manual_seed(0), output_type="latent", **CALL)
    assert out.stats.target_forwards == len(plan) == 3 and torch.isfinite(out.images).all()


def test_the_model_s_x0_clip_bounds_every_token(pipe):
    clipped = MARPipeline(MARModel(**{**TINY, "x0_clip": 0.5}), pipe.vae, MARModel(**{**TINY, "x0_clip": 0.5}))
    clipped.transformer.load_state_dict(pipe.transformer.state_dict())
    for decoding in ("ar", "speculative"):
        tokens = clipped([1, 2], decoding=decoding, generator=torch.Generator().manual_seed(0), output_type="latent",
                         **CALL).images
        assert tokens.abs().max() <= 0.5 and tokens.abs().max() > 0.1


def test_save_and_load_round_trip(pipe, tmp_path):
    pipe.save_pretrained(tmp_path)
    again = MARPipeline.from_pretrained(tmp_path)
    assert again.draft_transformer is not None
    kwargs = dict(generator=torch.Generator().manual_seed(0), output_type="latent", **CALL)
    first = pipe([1], **kwargs).images
    kwargs["generator"] = torch.Generator().manual_seed(0)
    assert torch.equal(again([1], **kwargs).images, first)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [(dict(class_labels=[30]), ValueError, r"class_labels must be in \[0, 10\)"),
     (dict(class_labels="cat"), TypeError, "class_labels must be an int"),
     (dict(num_iter=0), ValueError, r"num_iter must be an int in \[1, 16\]"),
     (dict(num_diffusion_steps=0), ValueError, "num_diffusion_steps"),
     (dict(decoding="jacobi"), ValueError, "decoding must be one of"),
     (dict(decoding="speculative", acceptance="approx"), ValueError, "acceptance must be one of"),
     (dict(output_type="latents"), ValueError, "output_type must be one of"),
     (dict(plan=[8, 7]), ValueError, "plan must be positive token counts summing to seq_len=16"),
     (dict(plan=[16], decoding="speculative"), ValueError, r"plan applies to decoding=AR\(\) only"),
     (dict(generator=[torch.Generator()] * 2), ValueError, "generator")],
)
def test_clear_errors(pipe, kwargs, error, match):
    call = {"class_labels": [1], **CALL, **kwargs}
    with pytest.raises(error, match=match):
        pipe(**call)


def test_speculative_needs_a_draft(pipe):
    single = MARPipeline(pipe.transformer, pipe.vae)
    with pytest.raises(ValueError, match="needs a draft MAR; this pipeline has none"):
        single([1], decoding="speculative", **CALL)


def test_the_decoding_component_is_saved_loaded_swappable_and_the_same_as_its_shorthand(pipe, tmp_path):
    import json

    from mmspec import AR, ContinuousSpeculation, MARPipeline, Paper

    def latent():
        return dict(generator=torch.Generator().manual_seed(1), output_type="latent", **CALL)

    speculation = ContinuousSpeculation(gamma=2, prefill_ratio=0.25, acceptance=Paper(), max_tries=50)
    as_object = pipe([0, 5], decoding=speculation, **latent())
    flat = pipe([0, 5], decoding="speculative", gamma=2, prefill_ratio=0.25, acceptance="paper", max_tries=50,
                **latent())
    assert torch.equal(as_object.images, flat.images) and as_object.stats.method == speculation.describe()
    assert pipe.decoding.name == "ar" and pipe([0], **latent()).stats.method == "AR()"  # the continuous AR
    pipe.decoding = speculation
    try:
        pipe.save_pretrained(tmp_path)
        assert json.loads((tmp_path / "model_index.json").read_text())["decoding"] == {
            "name": "speculative", "gamma": 2, "prefill_ratio": 0.25, "acceptance": {"name": "paper"},
            "max_tries": 50, "proposals_per_round": 8}
        loaded = MARPipeline.from_pretrained(tmp_path)
        loaded.set_progress_bar_config(disable=True)
        assert loaded.decoding == speculation
        assert torch.equal(loaded([0, 5], **latent()).images.to(as_object.images.dtype), as_object.images)
    finally:
        pipe.decoding = AR()


def test_replayed_chains_through_the_pipeline_and_cuda_graphs_refused_on_a_cpu(pipe):
    """The pipeline hands its `sampler_graphs` to the decoding (a CUDA pipeline makes them itself; tape graphs here
    run the same replay path) and the images do not change."""
    from mmspec.continuous.graphs import SamplerGraphs

    call = dict(generator=torch.Generator().manual_seed(2), output_type="latent", decoding="speculative", gamma=2,
                **CALL)
    eager = pipe([1, 7], **call).images
    pipe.sampler_graphs = SamplerGraphs(cuda=False)
    try:
        for _ in range(2):
            assert torch.equal(pipe([1, 7], **{**call, "generator": torch.Generator().manual_seed(2)}).images, eager)
        assert pipe.sampler_graphs.captured
    finally:
        pipe.sampler_graphs = None
    with pytest.raises(ValueError, match=r"enable_cuda_graphs needs the pipeline on a CUDA device"):
        pipe.enable_cuda_graphs()


TINY_KL = dict(ch=32, ch_mult=(1, 2, 2), num_res_blocks=1, encoder_attn_resolutions=(), resolution=16)
TINY_HEADS = dict(encoder_num_heads=4, decoder_num_heads=4)  # a width no official size has


def write_mar_release(folder, model: MARModel, vae: KLAutoencoder, drop: str | None = None) -> None:
    """A MAR release as LTH14/mar publishes it: `checkpoint-last.pth` as its training script saves it (raw and EMA
    weights, optimizer, epoch, scaler, args) and LDM's `kl16.ckpt` (weights beside its loss's entries)."""
    import argparse

    folder.mkdir(parents=True, exist_ok=True)
    ema = {k: v for k, v in model.state_dict().items() if k != drop}
    raw = {k: torch.zeros_like(v) for k, v in ema.items()}
    torch.save({"model": raw, "model_ema": ema, "optimizer": {}, "epoch": 399, "scaler": {},
                "args": argparse.Namespace(model="mar_tiny", cfg=3.0)}, folder / "checkpoint-last.pth")
    torch.save({"model": {**vae.state_dict(), "loss.logvar": torch.zeros(())}}, folder / "kl16.ckpt")


def test_a_mar_release_folder_loads_as_published_and_generates(pipe, tmp_path):
    """from_pretrained(folder) on checkpoint-last.pth + kl16.ckpt: the EMA weights and the autoencoder, the size
    read from the weights, the same images as the pipeline built from them in code; the raw weights on request;
    a missing weight, a missing autoencoder and a folder of two models are refused by name."""
    write_mar_release(tmp_path / "mar", pipe.transformer, pipe.vae)
    loaded = MARPipeline.from_pretrained(tmp_path / "mar", vae_config=TINY_KL, **TINY_HEADS)
    assert loaded.draft_transformer is None and loaded.transformer.config.seq_len == TINY["seq_len"]
    expected = MARPipeline(pipe.transformer, pipe.vae)
    for p in (loaded, expected):
        p.set_progress_bar_config(disable=True)
    images = [p([1, 2], generator=[torch.Generator().manual_seed(s) for s in (0, 1)], output_type="np", **CALL).images
              for p in (loaded, expected)]
    assert images[0].shape == (2, 16, 16, 3) and (images[0] == images[1]).all()
    raw = MARPipeline.from_mar_release(tmp_path / "mar", weights="model", vae_config=TINY_KL, **TINY_HEADS)
    assert all(v.abs().sum() == 0 for v in raw.transformer.state_dict().values())
    write_mar_release(tmp_path / "cut", pipe.transformer, pipe.vae, drop="fake_latent")
    with pytest.raises(ValueError, match=r"checkpoint-last.pth lacks 1 weight\(s\) of this MARModel: fake_latent$"):
        MARPipeline.from_pretrained(tmp_path / "cut", vae_config=TINY_KL, **TINY_HEADS)
    (tmp_path / "mar" / "kl16.ckpt").rename(tmp_path / "kl16.ckpt")
    with pytest.raises(ValueError, match=r"has no KL-16 autoencoder \(kl16.ckpt\): put it in the folder or pass vae="):
        MARPipeline.from_pretrained(tmp_path / "mar", vae_config=TINY_KL, **TINY_HEADS)
    again = MARPipeline.from_pretrained(tmp_path / "mar", vae=tmp_path / "kl16.ckpt", vae_config=TINY_KL,
                                        **TINY_HEADS)
    assert torch.equal(again.vae.post_quant_conv.weight, pipe.vae.post_quant_conv.weight)
    with pytest.raises(ValueError, match="encoder width 32 is not an official MAR size"):
        MARPipeline.from_pretrained(tmp_path / "mar", vae=tmp_path / "kl16.ckpt", vae_config=TINY_KL)
    torch.save({}, tmp_path / "mar" / "checkpoint-10.pth")
    with pytest.raises(ValueError, match=r"must hold one MAR model file \(checkpoint-last.pth\), found "
                                         r"\['checkpoint-10.pth', 'checkpoint-last.pth'\]"):
        MARPipeline.from_pretrained(tmp_path / "mar")
