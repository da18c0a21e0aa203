"""The transformers-family pipelines (Janus, Emu3, Lumina-mGPT) on tiny random models and word-level tokenizers built
in code: the prompt template each family needs, one call for every decoding / acceptance with the same outputs and
stats as the embedded model, greedy SJD = AR through the pipeline, save / load round trips, loading the family's own
checkpoint directory, the auto registry, and clear errors (another family's directory, a missing VQ decoder weight, an
image size the model cannot make)."""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from mmspec.pipelines.auto import AutoARImagePipeline
from mmspec.pipelines.emu3 import Emu3Pipeline
from mmspec.pipelines.emu3.pipeline_emu3 import NEGATIVE_PROMPT
from mmspec.pipelines.janus import JanusPipeline
from mmspec.pipelines.lumina_mgpt import LuminaMGPTPipeline
from mmspec.pipelines.pipeline_output import ARImagePipelineOutput
from tests.models import test_emu3, test_janus, test_lumina_mgpt

PROMPTS = ["a red circle", "a blue square"]


def word_tokenizer(vocab: dict[str, int], specials: list[str], bos: str | None, pad: str):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if bos is not None:
        backend.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, vocab[bos])])
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=pad, unk_token="<unk>", bos_token=bos,
                                   additional_special_tokens=specials)


WORDS = {"a": 20, "red": 21, "circle": 22, "blue": 23, "square": 24}


def janus_pipeline():
    vocab = {**WORDS, "<unk>": 0, "<pad>": test_janus.PAD, "<s>": test_janus.BOS, "<begin_of_image>": test_janus.BOI,
             "<|User|>:": 10, "<|Assistant|>:": 11}
    tokenizer = word_tokenizer(vocab, ["<begin_of_image>"], "<s>", "<pad>")
    return JanusPipeline(test_janus.tiny_janus(), tokenizer)


def emu3_pipeline():
    vocab = {**WORDS, "<unk>": 3, "<pad>": test_emu3.PAD, "<s>": test_emu3.BOS, "<|image start|>": test_emu3.BOI,
             "<|image token|>": test_emu3.WRAPPER, "3*4": 8, "ugly": 9}
    tokenizer = word_tokenizer(vocab, ["<|image start|>", "<|image token|>"], "<s>", "<pad>")
    return Emu3Pipeline(test_emu3.tiny_emu3(), tokenizer)


def lumina_pipeline():
    vocab = {**WORDS, "<unk>": 3, "<pad>": test_lumina_mgpt.PAD, "<s>": test_lumina_mgpt.BOS,
             "<reserved08706>": test_lumina_mgpt.SEP, "Generate": 4, "an": 5, "image": 6, "of": 7, "8x4": 8,
             "according": 9, "to": 10, "the": 11, "following": 12, "prompt:": 13}
    tokenizer = word_tokenizer(vocab, ["<reserved08706>"], "<s>", "<pad>")
    model, vqgan = test_lumina_mgpt.tiny_lumina()
    return LuminaMGPTPipeline(model, tokenizer, vqgan, target_size=8)


# family: (pipeline builder, size kwargs, image (height, width) in pixels, span tokens)
FAMILIES = {
    "janus": (janus_pipeline, {}, (8, 8), 16),
    "emu3": (emu3_pipeline, {"height": 12, "width": 16}, (12, 16), 15),
    "lumina": (lumina_pipeline, {"height": 4, "width": 8}, (4, 8), 10),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    build, size, pixels, span = FAMILIES[request.param]
    pipe = build()
    pipe.set_progress_bar_config(disable=True)
    return request.param, pipe, size, pixels, span


def seeded(seed):
    return torch.Generator().manual_seed(seed)


def test_prompts_follow_each_family_s_template():
    janus = janus_pipeline()
    condition = janus.encode_prompt(["a red circle", "a"], None, janus.image_adapter())
    B, P, BOI = test_janus.BOS, test_janus.PAD, test_janus.BOI
    assert condition.input_ids.tolist() == [[B, 10, 20, 21, 22, 11, BOI], [P, P, B, 10, 20, 11, BOI]]
    assert condition.attention_mask.tolist()[1] == [0, 0, 1, 1, 1, 1, 1]
    emu3 = emu3_pipeline()
    condition = emu3.encode_prompt(["a red"], ["ugly"], emu3.image_adapter(12, 16))
    e = test_emu3
    assert condition.input_ids.tolist() == [[e.BOS, 20, 21, e.BOI, 8, e.WRAPPER]]
    assert condition.negative_ids.tolist() == [[e.BOS, 9, e.BOI, 8, e.WRAPPER]]
    default = emu3.encode_prompt(["a"], None, emu3.image_adapter(12, 16)).negative_ids  # Emu3's script's negative
    assert torch.equal(default, emu3.encode_prompt(["a"], [NEGATIVE_PROMPT], emu3.image_adapter(12, 16)).negative_ids)
    assert default.shape[1] == 4 + len(NEGATIVE_PROMPT.split())
    # Janus's template strips the message; Emu3 writes its BOS out whether or not the tokenizer adds one
    assert torch.equal(janus.encode_prompt(["  a red circle \n"], None, janus.image_adapter()).input_ids,
                       janus.encode_prompt(["a red circle"], None, janus.image_adapter()).input_ids)
    emu3.tokenizer._tokenizer.post_processor = None  # a GPT-style tokenizer: no BOS of its own
    assert emu3.encode_prompt(["a red"], ["ugly"], emu3.image_adapter(12, 16)).input_ids.tolist() == [
        [e.BOS, 20, 21, e.BOI, 8, e.WRAPPER]]
    lumina = lumina_pipeline()
    condition = lumina.encode_prompt(["a red circle"], None, lumina.image_adapter(4, 8))
    lm = test_lumina_mgpt
    assert condition.input_ids.tolist() == [[lm.BOS, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 20, 21, 22, lm.SEP,
                                             *lm.SUFFIX]]


@pytest.mark.parametrize(("decoding", "acceptance"), [("ar", None), ("sjd", "exact"), ("sjd", "lantern")])
def test_one_call_for_every_decoding_with_the_embedded_model_s_outputs(family, decoding, acceptance):
    name, pipe, size, (height, width), span = family
    out = pipe(PROMPTS, num_images_per_prompt=2, generator=seeded(0), decoding=decoding, acceptance=acceptance,
               output_type="np", **size, **({"lantern_k": 3} if acceptance == "lantern" else {}))
    assert isinstance(out, ARImagePipelineOutput) and out.images.shape == (4, height, width, 3)
    assert 0 <= out.images.min() <= out.images.max() <= 1
    assert int(out.stats.new_tokens.sum()) == 4 * span
    assert out.stats.target_forwards == span if decoding == "ar" else out.stats.target_forwards < span
    pil = pipe(PROMPTS[0], generator=seeded(0), **size).images
    assert pil[0].size == (width, height)


def test_greedy_sjd_equals_greedy_ar_through_the_pipeline(family):
    name, pipe, size, _, _ = family
    ar = pipe(PROMPTS, temperature=0, decoding="ar", output_type="latent", **size).images
    sjd = pipe(PROMPTS, temperature=0, decoding="sjd", window=4, output_type="latent", **size).images
    assert torch.equal(ar, sjd)
    assert not torch.equal(ar, pipe(PROMPTS, temperature=0, guidance_scale=1.0, decoding="ar", output_type="latent",
                                    **size).images)  # the guidance reaches the model


def test_save_load_round_trip_gives_identical_images(family, tmp_path):
    name, pipe, size, _, _ = family
    pipe.save_pretrained(tmp_path)
    loaded = AutoARImagePipeline.from_pretrained(tmp_path)
    assert type(loaded) is type(pipe)
    loaded.set_progress_bar_config(disable=True)
    a = pipe(PROMPTS, generator=seeded(3), output_type="np", decoding="sjd", **size).images
    b = loaded(PROMPTS, generator=seeded(3), output_type="np", decoding="sjd", **size).images
    assert np.array_equal(a, b)


def save_checkpoint_dir(pipe, path):
    pipe.model.save_pretrained(path)
    pipe.tokenizer.save_pretrained(path)


def test_from_pretrained_loads_the_family_s_own_checkpoint_directory(family, tmp_path):
    name, pipe, size, _, _ = family
    save_checkpoint_dir(pipe, tmp_path)
    extra = {"vqgan": pipe.vqgan, "target_size": 8} if name == "lumina" else {}
    loaded = type(pipe).from_pretrained(tmp_path, **extra)
    loaded.set_progress_bar_config(disable=True)
    # one decoding for both: `auto` may choose another for another pipeline (its own cost curve and runs)
    a = pipe(PROMPTS, generator=seeded(4), output_type="latent", decoding="sjd", **size).images
    assert torch.equal(a, loaded(PROMPTS, generator=seeded(4), output_type="latent", decoding="sjd", **size).images)
    assert type(AutoARImagePipeline.from_pretrained(tmp_path, **extra)) is type(pipe)


def test_clear_errors_for_another_family_s_directory_and_missing_vq_decoder_weights(tmp_path):
    janus, emu3 = janus_pipeline(), emu3_pipeline()
    save_checkpoint_dir(emu3, tmp_path / "emu3")
    with pytest.raises(ValueError, match="is a 'emu3' checkpoint, which JanusPipeline does not load; use "
                                         "Emu3Pipeline.from_pretrained"):
        JanusPipeline.from_pretrained(tmp_path / "emu3")
    janus.save_pretrained(tmp_path / "saved_janus")
    with pytest.raises(ValueError, match="holds a JanusPipeline .* not a Emu3Pipeline"):
        Emu3Pipeline.from_pretrained(tmp_path / "saved_janus")
    save_checkpoint_dir(janus, tmp_path / "janus")
    weights = load_file(tmp_path / "janus" / "model.safetensors")
    dropped = [key for key in weights if "vqmodel.decoder.conv_out" in key]
    assert dropped
    save_file({k: v for k, v in weights.items() if k not in dropped}, tmp_path / "janus" / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"lacks 2 VQ decoder weight\(s\)"):
        JanusPipeline.from_pretrained(tmp_path / "janus")
    with pytest.raises(ValueError, match="hold no image decoder: pass vqgan="):
        save_checkpoint_dir(lumina_pipeline(), tmp_path / "lumina")
        LuminaMGPTPipeline.from_pretrained(tmp_path / "lumina")


@pytest.mark.parametrize(("name", "size", "match"), [
    ("janus", {"height": 16}, "Janus cannot generate a 16x8 .* makes 8x8 only"),
    ("emu3", {"height": 13, "width": 16}, "multiples of 4 pixels"),
    ("emu3", {}, "prompt \\+ image need .* positions; the model holds 512"),
    ("lumina", {"height": 8, "width": 12}, "at target_size 8 it makes 7 sizes"),
])
def test_an_image_size_the_model_cannot_make_raises(name, size, match):
    pipe = FAMILIES[name][0]()
    with pytest.raises(ValueError, match=match):
        pipe(PROMPTS[0], **size)


def test_negative_prompt_only_where_the_family_s_cfg_takes_one():
    with pytest.raises(ValueError, match="JanusPipeline takes no negative_prompt"):
        janus_pipeline()(PROMPTS[0], negative_prompt="ugly")
    with pytest.raises(ValueError, match="negative_prompt must be a str or a list of 2 str"):
        emu3_pipeline()(PROMPTS, negative_prompt=["ugly"], height=12, width=16)
