"""LlamaGenPipeline: diffusers call conventions, reproducibility, save/load, CFG, callbacks and input errors."""

import numpy as np
import PIL.Image
import pytest
import torch

from mmspec.image.loop import PAD_ID
from mmspec.pipelines.llamagen import ARImagePipelineOutput, LlamaGenPipeline
from tests.image.test_decoding import recompute_sampling
from tests.models.llamagen_tiny import tiny_pipeline

PROMPTS = ["a red circle", "a blue square on the left"]


@pytest.fixture(scope="module")
def pipe():
    return tiny_pipeline()


def seeded(*seeds):
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    return generators[0] if len(generators) == 1 else generators


@pytest.mark.parametrize(
    ("output_type", "check"),
    [
        ("pil", lambda im: len(im) == 4 and all(isinstance(i, PIL.Image.Image) and i.size == (8, 8) for i in im)),
        ("np", lambda im: isinstance(im, np.ndarray) and im.shape == (4, 8, 8, 3) and 0 <= im.min() <= im.max() <= 1),
        ("pt", lambda im: isinstance(im, torch.Tensor) and im.shape == (4, 3, 8, 8) and 0 <= im.min() <= im.max() <= 1),
        ("latent", lambda im: im.dtype == torch.long and im.shape == (4, 16) and 0 <= im.min() and im.max() < 24),
    ],
)
def test_output_types(pipe, output_type, check):
    out = pipe(PROMPTS, num_images_per_prompt=2, generator=seeded(0), output_type=output_type)
    assert isinstance(out, ARImagePipelineOutput) and check(out.images)
    assert int(out.stats.new_tokens.sum()) == 4 * 16 and out.stats.chosen_by.startswith("auto: ")  # the default


def test_decode_tokens_is_what_the_call_decodes(pipe):
    tokens = pipe(PROMPTS, generator=seeded(0, 1), output_type="latent").images
    pixels = pipe(PROMPTS, generator=seeded(0, 1), output_type="np").images
    assert np.array_equal(pipe.decode_tokens(tokens, output_type="np"), pixels)
    assert [im.size for im in pipe.decode_tokens(tokens)] == [(8, 8), (8, 8)]
    with pytest.raises(ValueError, match="output_type must be one of"):
        pipe.decode_tokens(tokens, output_type="latent")


def test_return_dict_false_gives_images_and_stats(pipe):
    images, stats = pipe(PROMPTS[0], generator=seeded(0), output_type="latent", return_dict=False, decoding="sjd")
    assert torch.equal(images, pipe(PROMPTS[0], generator=seeded(0), output_type="latent", decoding="sjd").images)
    assert stats.target_forwards < 16
    _, ar_stats = pipe(PROMPTS[0], generator=seeded(0), output_type="latent", return_dict=False, decoding="ar")
    assert ar_stats.target_forwards == 16


def test_seeded_reproducibility_and_seed_sensitivity(pipe):
    a = pipe(PROMPTS, generator=seeded(5), output_type="latent").images
    assert torch.equal(a, pipe(PROMPTS, generator=seeded(5), output_type="latent").images)
    assert not torch.equal(a, pipe(PROMPTS, generator=seeded(6), output_type="latent").images)


def test_list_of_generators_gives_per_image_seeds(pipe):
    """Image b of a batch with generators [g_0, g_1, ...] equals a batch-1 call of its prompt with g_b alone."""
    batch = pipe(PROMPTS, num_images_per_prompt=2, generator=seeded(1, 2, 3, 4), output_type="latent",
                 decoding="sjd").images
    for b, seed in enumerate([1, 2, 3, 4]):
        single = pipe(PROMPTS[b // 2], generator=seeded(seed), output_type="latent", decoding="sjd").images
        assert torch.equal(batch[b], single[0])


def test_save_load_round_trip_gives_identical_images(pipe, tmp_path):
    pipe.save_pretrained(tmp_path)
    loaded = LlamaGenPipeline.from_pretrained(tmp_path, dtype=torch.float64)
    loaded.set_progress_bar_config(disable=True)
    # one decoding for both: `auto` may choose another for a pipeline with another run history
    a = pipe(PROMPTS, generator=seeded(3), output_type="pt", decoding="sjd").images
    b = loaded(PROMPTS, generator=seeded(3), output_type="pt", decoding="sjd").images
    assert torch.equal(a, b)


@pytest.mark.parametrize("guidance_scale", [1.0, 4.0])
def test_pipeline_equals_sampling_from_the_recomputed_model(pipe, guidance_scale):
    """guidance_scale = 1 is the conditional model alone; otherwise logits are CFG-combined before the warpers."""
    from mmspec.core.probs import SamplingConfig

    sampling = SamplingConfig(temperature=0.9, top_k=6, guidance_scale=guidance_scale)
    condition = pipe.encode_prompt(PROMPTS)
    with torch.no_grad():
        expected = recompute_sampling(pipe.transformer, condition.states, condition.mask, sampling, seeded(7, 8))
    got = pipe(PROMPTS, guidance_scale=guidance_scale, temperature=0.9, top_k=6, generator=seeded(7, 8),
               output_type="latent", decoding="ar").images
    assert torch.equal(got, expected)


@pytest.mark.parametrize("cfg_interval", [0, 5])
def test_cfg_interval_guides_the_first_tokens_only_as_llamagen_generate(pipe, cfg_interval):
    """LlamaGen's count: image tokens 0 .. cfg_interval + 1 guided, later ones from the conditional logits; every
    decoding samples that law (greedy SJD = greedy AR), and it is not the law of guiding every token."""
    from mmspec.core.probs import SamplingConfig

    sampling = SamplingConfig(temperature=0.9, top_k=6, guidance_scale=4.0, cfg_interval=cfg_interval)
    condition = pipe.encode_prompt(PROMPTS)
    with torch.no_grad():
        expected = recompute_sampling(pipe.transformer, condition.states, condition.mask, sampling, seeded(7, 8))
    call = dict(guidance_scale=4.0, temperature=0.9, top_k=6, output_type="latent")
    got = pipe(PROMPTS, cfg_interval=cfg_interval, generator=seeded(7, 8), decoding="ar", **call).images
    assert torch.equal(got, expected)
    assert not torch.equal(got, pipe(PROMPTS, generator=seeded(7, 8), decoding="ar", **call).images)
    greedy = dict(guidance_scale=4.0, temperature=0.0, cfg_interval=cfg_interval, output_type="latent")
    ar = pipe(PROMPTS, decoding="ar", **greedy).images
    assert torch.equal(pipe(PROMPTS, decoding="sjd", window=5, **greedy).images, ar)


def test_prompts_are_cleaned_as_llamagen_cleans_its_captions(pipe):
    """Upper case, markup, runs of spaces and a trailing mark reach the text encoder as LlamaGen's T5 saw captions."""
    clean = pipe.encode_prompt(["a red circle on the left"])
    for prompt in ("  A RED   Circle on the LEFT ", "<b>a red</b> circle on the left", "a red circle on the left-"):
        condition = pipe.encode_prompt([prompt])
        assert torch.equal(condition.states, clean.states) and torch.equal(condition.mask, clean.mask), prompt


def test_a_prompt_longer_than_the_text_context_is_cut_with_a_warning(pipe, caplog):
    """As LlamaGen's T5 embedder truncates (to the 6 slots of the tiny model), with one warning naming the cut."""
    import logging

    long_prompt = "a red circle on the left a blue square"
    with caplog.at_level(logging.WARNING, logger="mmspec.pipelines.llamagen.pipeline_llamagen"):
        condition = pipe.encode_prompt([long_prompt, "a red circle"])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["prompt 'a red circle on the left a blue square' is 9 tokens long and the model's text "
                        "context holds 6; this part was cut: 'a blue square'"]
    first_six = pipe.encode_prompt(["a red circle on the left"])
    assert torch.allclose(condition.states[:1], first_six.states, atol=1e-12) and condition.mask[0].all()


def test_callback_sees_every_step_and_interrupt_stops_early(pipe):
    seen = []

    def callback(p, step, n_generated, kwargs):
        seen.append((step, n_generated, kwargs["tokens"]))
        if step == 4:
            p._interrupt = True
        return kwargs

    out = pipe(PROMPTS[0], generator=seeded(0), output_type="latent", callback_on_step_end=callback,
               callback_on_step_end_tensor_inputs=["tokens", "n_committed"], decoding="ar")
    assert [s[:2] for s in seen] == [(i, i + 1) for i in range(5)]
    assert (out.images[0, :5] != PAD_ID).all() and (out.images[0, 5:] == PAD_ID).all()
    # the prefill made token 0, one forward each of tokens 1..4, and none is spent after the interruption
    assert int(out.stats.new_tokens.sum()) == 5 and out.stats.target_forwards == 1 + 4
    assert "new_tokens" in out.stats.table()
    pil = pipe(PROMPTS[0], generator=seeded(0), output_type="np", callback_on_step_end=callback, decoding="ar").images
    assert np.allclose(pil[0, 4:, :, :], 0.5)  # the ungenerated lower rows of cells are shown mid-grey


def test_sjd_steps_commit_runs_of_tokens_and_interrupt_keeps_what_was_committed(pipe):
    seen = []

    def callback(p, step, n_generated, kwargs):
        seen.append(kwargs["n_committed"].clone())
        p._interrupt = step == 2
        return kwargs

    out = pipe(PROMPTS[0], generator=seeded(0), output_type="latent", callback_on_step_end=callback,
               callback_on_step_end_tensor_inputs=["n_committed"], decoding="sjd", window=8)
    committed = int(seen[-1][0])
    assert len(seen) == 3 and committed >= 3  # every forward commits at least one token
    assert (out.images[0, :committed] != PAD_ID).all() and (out.images[0, committed:] == PAD_ID).all()
    assert int(out.stats.new_tokens.sum()) == committed


def test_greedy_sjd_equals_greedy_ar(pipe):
    ar = pipe(PROMPTS, temperature=0, output_type="latent", decoding="ar").images
    for options in ({"window": 3, "init": "vertical", "coupling": "gumbel"}, {"window": 20}):
        assert torch.equal(pipe(PROMPTS, temperature=0, output_type="latent", decoding="sjd", **options).images, ar)


def test_callback_cannot_replace_committed_tokens(pipe):
    def callback(p, step, n_generated, kwargs):
        return {"tokens": torch.zeros_like(kwargs["tokens"])}

    with pytest.raises(ValueError, match="read-only"):
        pipe(PROMPTS[0], generator=seeded(0), callback_on_step_end=callback)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"prompt": []}, ValueError, "empty list"),
        ({"prompt": 3}, TypeError, "prompt must be"),
        ({"cfg_interval": -2}, ValueError, "cfg_interval must be >= -1"),
        ({"prompt": "@someone #123 www.example.com"}, ValueError, "has no words left once cleaned"),
        ({"cfg_interval": 2.5}, TypeError, "cfg_interval must be an int"),
        ({"guidance_scale": -1.0}, ValueError, "guidance_scale"),
        ({"temperature": -0.5}, ValueError, "temperature"),
        ({"num_images_per_prompt": 0}, ValueError, "num_images_per_prompt"),
        ({"generator": [torch.Generator()] * 3}, ValueError, "3 generators but the batch size is 2"),
        ({"output_type": "jpeg"}, ValueError, "output_type must be one of"),
        ({"callback_on_step_end_tensor_inputs": ["logits"]}, ValueError, "logits"),
        ({"decoding": "nope"}, ValueError, "decoding must be one of"),
        ({"decoding": {"window": 3}}, ValueError, "must name its component"),
        ({"decoding": 3}, TypeError, "decoding must be a name"),
    ],
)
def test_bad_inputs_raise_clear_errors(pipe, kwargs, error, match):
    call = {"prompt": "a red circle", "num_images_per_prompt": 2, **kwargs}
    with pytest.raises(error, match=match):
        pipe(**call)


def test_pipeline_rejects_a_c2i_transformer():
    from tests.models.llamagen_tiny import tiny_text_encoder, tiny_tokenizer, tiny_transformer, tiny_vq

    with pytest.raises(ValueError, match="t2i"):
        LlamaGenPipeline(tiny_transformer("c2i"), tiny_vq(), tiny_tokenizer(), tiny_text_encoder())


def with_draft(pipe):
    from tests.models.llamagen_tiny import tiny_transformer

    drafted = LlamaGenPipeline(**pipe.components | {"draft_transformer": tiny_transformer(seed=1)})
    drafted.set_progress_bar_config(disable=True)
    return drafted


def test_draft_decoding_uses_the_draft_transformer_and_survives_save_load(pipe, tmp_path):
    drafted = with_draft(pipe)
    ar = pipe(PROMPTS, temperature=0, output_type="latent", decoding="ar").images
    out = drafted(PROMPTS, temperature=0, output_type="latent", decoding="draft", draft_length=3)
    assert torch.equal(out.images, ar) and out.stats.draft_forwards > 0
    drafted.save_pretrained(tmp_path)
    loaded = LlamaGenPipeline.from_pretrained(tmp_path, dtype=torch.float64)
    loaded.set_progress_bar_config(disable=True)
    assert loaded.draft_transformer is not None
    a = drafted(PROMPTS, generator=seeded(1, 2), output_type="latent", decoding="draft").images
    assert torch.equal(loaded(PROMPTS, generator=seeded(1, 2), output_type="latent", decoding="draft").images, a)
    with pytest.raises(ValueError, match="needs a draft model"):
        pipe(PROMPTS, decoding="draft")


def test_draft_trees_through_the_pipeline(pipe, tmp_path):
    """decoding="draft" with tree_width > 1: greedy output is AR's; a pipeline saved with a tree decoding keeps it."""
    from mmspec import DraftModel

    drafted = with_draft(pipe)
    ar = pipe(PROMPTS, temperature=0, output_type="latent", decoding="ar").images
    tree = drafted(PROMPTS, temperature=0, output_type="latent", decoding="draft", draft_length=2, tree_width=2)
    assert torch.equal(tree.images, ar) and tree.stats.method == DraftModel(2, tree_width=2).describe()
    drafted.decoding = DraftModel(3, tree_width=2)
    drafted.save_pretrained(tmp_path)
    assert LlamaGenPipeline.from_pretrained(tmp_path, dtype=torch.float64).decoding == DraftModel(3, tree_width=2)
    with pytest.raises(ValueError, match="acceptance must be Exact"):
        drafted(PROMPTS, decoding="draft", tree_width=2, acceptance="lantern")


@pytest.mark.parametrize("decoding", ["sjd", "draft"])
def test_lantern_acceptance_reports_its_distortion(pipe, decoding):
    drafted = with_draft(pipe)
    exact = drafted(PROMPTS, generator=seeded(1, 2), output_type="latent", decoding=decoding)
    relaxed = drafted(PROMPTS, generator=seeded(1, 2), output_type="latent", decoding=decoding, acceptance="lantern",
                      lantern_k=8, lantern_delta=0.4)
    assert exact.stats.excess_acceptance is None
    assert relaxed.stats.excess_acceptance > 0 and relaxed.stats.acceptance_rate > exact.stats.acceptance_rate
    lossless = drafted(PROMPTS, generator=seeded(1, 2), output_type="latent", decoding=decoding, acceptance="lantern",
                       lantern_k=8, lantern_delta=0.0)
    assert torch.equal(lossless.images, exact.images)
    with pytest.raises(ValueError, match="do.* not take"):
        drafted(PROMPTS, decoding="ar", acceptance="lantern")


def test_decoding_component_object_and_shorthand_are_the_same_call(pipe):
    from mmspec import SJD, DraftModel, Lantern

    def latent():  # fresh generators per call
        return dict(generator=seeded(1, 2), output_type="latent")

    as_object = pipe(PROMPTS, decoding=SJD(window=3, init="vertical", acceptance=Lantern(k=8, delta=0.4)), **latent())
    flat = pipe(PROMPTS, decoding="sjd", window=3, init="vertical", acceptance="lantern", lantern_k=8,
                lantern_delta=0.4, **latent())  # the spelling from before the components, still taken
    held = LlamaGenPipeline(**pipe.components, decoding=SJD(window=5, init="vertical"))
    held.set_progress_bar_config(disable=True)
    # no decoding=: the settings are those of the pipeline's own component
    own = held(PROMPTS, window=3, acceptance=Lantern(k=8, delta=0.4), **latent())
    assert torch.equal(as_object.images, flat.images) and torch.equal(as_object.images, own.images)
    expected = SJD(3, "vertical", acceptance=Lantern(k=8, delta=0.4)).describe()
    assert as_object.stats.method == flat.stats.method == expected
    drafted = with_draft(pipe)
    assert torch.equal(drafted(PROMPTS, decoding=DraftModel(draft_length=2), **latent()).images,
                       drafted(PROMPTS, decoding="draft", draft_length=2, **latent()).images)
    with pytest.raises(ValueError, match="only apply to a decoding given by name"):
        pipe(PROMPTS, decoding=SJD(window=3), window=4)


def test_the_pipeline_decoding_is_saved_loaded_and_swappable(pipe, tmp_path):
    import json

    from mmspec import AR, SJD, Lantern

    def latent():  # fresh generators per call
        return dict(generator=seeded(1, 2), output_type="latent")

    assert pipe.decoding == "auto" and pipe.config.decoding == "auto"
    held = LlamaGenPipeline(**pipe.components, decoding=SJD(window=5, coupling="gumbel", acceptance=Lantern(k=8)))
    held.set_progress_bar_config(disable=True)
    out = held(PROMPTS, **latent())
    assert out.stats.method == held.decoding.describe() and out.stats.chosen_by is None
    assert torch.equal(out.images, pipe(PROMPTS, decoding=held.decoding, **latent()).images)
    held.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "model_index.json").read_text())["decoding"]
    assert saved == {"name": "sjd", "window": 5, "init": "horizontal", "coupling": "gumbel",
                     "acceptance": {"name": "lantern", "k": 8, "delta": None, "lam": None}, "tree_width": 1,
                     "tree_depth": 2}
    loaded = LlamaGenPipeline.from_pretrained(tmp_path, dtype=torch.float64)
    loaded.set_progress_bar_config(disable=True)
    assert loaded.decoding == held.decoding
    assert torch.equal(loaded(PROMPTS, **latent()).images, out.images)
    loaded.decoding = AR()  # swapped on the loaded pipeline; a call may still name another
    assert loaded(PROMPTS, **latent()).stats.method == "AR()" and loaded.config.decoding == {"name": "ar"}
    assert loaded(PROMPTS, decoding="sjd", **latent()).stats.method.startswith("SJD(window=16")
    loaded.decoding = {"name": "sjd", "window": 7}  # a config dict, as model_index.json holds it
    assert loaded.decoding == SJD(window=7)
    with pytest.raises(ValueError, match="decoding must be one of"):
        loaded.decoding = "fast"
