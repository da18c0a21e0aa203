"""Emu3Adapter on a tiny random Emu3ForConditionalGeneration (built in code, offline): AR through the adapter equals
transformers' own `generate` with the documented `prefix_allowed_tokens_fn` and unbatched CFG token for token (greedy)
and in law (sampled); end-of-line tokens land on their absolute positions in every decoding; greedy SJD = AR; the
batched-CFG cache equals a fresh prefill after every iteration; decode; LANTERN table; errors."""

import pytest
import torch

from mmspec.core.probs import SamplingConfig
from mmspec.image import AR, SJD
from mmspec.models.emu3 import Emu3Adapter
from mmspec.models.hf_image import PromptCondition
from tests.law import chi_square_p_value
from tests.models.family_checks import (
    check_cache_and_its_mutation,
    check_draft_heads_read_the_family_s_features,
    check_first_two_tokens_follow,
    check_greedy_sjd_equals_ar,
    check_lantern_table,
    exact_law_of_the_first_two_tokens,
    from_bpe,
    run,
)

CODES, H, W = 20, 3, 4
PAD, BOS, EOS, EOL, EOF, BOI, EOI, WRAPPER, FIRST_VISUAL = 0, 1, 2, 31, 32, 33, 34, 35, 40


def tiny_emu3(seed: int = 0, codes: int = CODES):
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    vocab = {f"w{i}": i for i in range(3, 30)}
    vocab.update({"<pad>": PAD, "<s>": BOS, "</s>": EOS, "<image>": 30, "<|extra_200|>": EOL, "<|extra_201|>": EOF,
                  "<|image start|>": BOI, "<|image end|>": EOI, "<|image token|>": WRAPPER})
    shuffled = torch.randperm(codes, generator=torch.Generator().manual_seed(1))  # BPE order != code order
    vocab.update({f"<|visual token{int(code):06d}|>": FIRST_VISUAL + i for i, code in enumerate(shuffled)})
    config = Emu3Config(
        vq_config={"codebook_size": CODES, "embed_dim": 8, "latent_channels": 8, "temporal_downsample_factor": 1,
                   "base_channels": 32, "channel_multiplier": [1, 2, 1], "hidden_size": 32, "attn_resolutions": []},
        text_config={"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "num_key_value_heads": 2, "intermediate_size": 37, "max_position_embeddings": 512,
                     "pad_token_id": PAD, "bos_token_id": BOS, "eos_token_id": EOS},
        vocabulary_map=vocab)
    torch.manual_seed(seed)
    return Emu3ForConditionalGeneration(config).eval()


@pytest.fixture(scope="module")
def model():
    return tiny_emu3()


# prompt ... <|image start|> "h*w" <|image token|>  (w8, w9 stand for the size text)
PROMPTS = torch.tensor([[BOS, 5, 6, 7, BOI, 8, 9, WRAPPER], [BOS, 10, 11, 12, BOI, 8, 9, WRAPPER],
                        [BOS, 13, 5, 14, BOI, 8, 9, WRAPPER]])
NEGATIVE = torch.tensor([[BOS, 20, 21, BOI, 8, 9, WRAPPER]]).expand(3, -1)


def allowed_tokens(model):
    """transformers' documented Emu3 image-generation constraint (docs/source/en/model_doc/emu3.md)."""
    visual = model.vocabulary_mapping.image_tokens

    def prefix_allowed_tokens_fn(batch_id, input_ids):
        offset = input_ids.shape[0] - torch.nonzero(input_ids == WRAPPER, as_tuple=True)[0][0]
        if offset % (W + 1) == 0:
            return [EOL]
        return {(W + 1) * H + 1: [EOF], (W + 1) * H + 2: [EOI], (W + 1) * H + 3: [EOS]}.get(int(offset), visual)

    return prefix_allowed_tokens_fn


def transformers_generate(model, prompts, negative, new_tokens, **kwargs):
    with torch.no_grad():
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
                             prefix_allowed_tokens_fn=allowed_tokens(model), negative_prompt_ids=negative,
                             negative_prompt_attention_mask=torch.ones_like(negative), **kwargs)
    return out[:, prompts.shape[1] :]


def test_greedy_ar_equals_transformers_generate_with_its_structure_and_cfg(model):
    adapter = Emu3Adapter(model, H, W)
    assert adapter.grid == (H, W + 1) and adapter.vocab_size == CODES + 1
    for guidance in (1.0, 3.0):
        ours, stats = run(AR(), adapter, PromptCondition(PROMPTS, negative_ids=NEGATIVE),
                          SamplingConfig(0, guidance_scale=guidance))
        theirs = transformers_generate(model, PROMPTS, NEGATIVE, H * (W + 1) + 3, do_sample=False,
                                       guidance_scale=guidance)
        assert torch.equal(adapter.to_bpe(ours), theirs[:, : H * (W + 1)]), guidance
        assert theirs[:, H * (W + 1) :].eq(torch.tensor([EOF, EOI, EOS])).all()
        assert stats.target_forwards == H * (W + 1)
    # without negative_ids the unconditional row is transformers' default: the last prompt token alone
    ours, _ = run(AR(), adapter, PromptCondition(PROMPTS), SamplingConfig(0, guidance_scale=3.0))
    theirs = transformers_generate(model, PROMPTS, PROMPTS[:, -1:], H * (W + 1), do_sample=False, guidance_scale=3.0)
    assert torch.equal(adapter.to_bpe(ours), theirs)


def test_sampled_ar_and_transformers_sampling_follow_the_same_law(model):
    adapter, rows = Emu3Adapter(model, H, W), 4000
    sampling = SamplingConfig(1.0, top_k=6, guidance_scale=2.0)
    condition = PromptCondition(PROMPTS[:1], negative_ids=NEGATIVE[:1])
    law = exact_law_of_the_first_two_tokens(adapter, condition, sampling)
    no_cfg = exact_law_of_the_first_two_tokens(adapter, condition, SamplingConfig(1.0, top_k=6))
    ours, _ = run(AR(), adapter, PromptCondition(PROMPTS[:1].expand(rows, -1),
                                                         negative_ids=NEGATIVE[:1].expand(rows, -1)),
                  sampling, torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    theirs = transformers_generate(model, PROMPTS[:1].expand(rows, -1), NEGATIVE[:1].expand(rows, -1), 2,
                                   do_sample=True, top_k=6, guidance_scale=2.0)
    V = adapter.vocab_size
    check_first_two_tokens_follow(law, ours, V, wrong_law=no_cfg)
    check_first_two_tokens_follow(law, from_bpe(adapter, theirs), V, wrong_law=no_cfg)


def test_only_the_image_rows_of_the_head_are_scored_and_a_misread_map_is_caught(model, monkeypatch):
    """The adapter scores the LM head's rows of the image span alone (VocabTrim's image range): its logits are the
    full head's at those ids, and transformers' own sampling (full head, CFG, its documented constraint) follows
    the law they give; rows gathered by local id instead of vocabulary id (a map left at "the first V ids") give
    a law transformers' samples reject."""
    adapter, rows = Emu3Adapter(model, H, W), 4000
    hidden = torch.randn(2, 3, model.config.text_config.hidden_size)
    full = model.lm_head(hidden)[..., adapter.token_ids]
    torch.testing.assert_close(adapter.image_logits(hidden)[..., :CODES], full[..., :CODES])
    assert adapter.image_head()[0].shape == (CODES + 1, model.config.text_config.hidden_size)
    sampling = SamplingConfig(1.0, top_k=6, guidance_scale=2.0)
    condition = PromptCondition(PROMPTS[:1], negative_ids=NEGATIVE[:1])
    torch.manual_seed(0)
    theirs = from_bpe(adapter, transformers_generate(model, PROMPTS[:1].expand(rows, -1),
                                                     NEGATIVE[:1].expand(rows, -1), 2, do_sample=True, top_k=6,
                                                     guidance_scale=2.0))
    check_first_two_tokens_follow(exact_law_of_the_first_two_tokens(adapter, condition, sampling), theirs,
                                  adapter.vocab_size)
    misread = Emu3Adapter(model, H, W)
    monkeypatch.setattr(misread, "image_head", lambda: (model.lm_head.weight[: CODES + 1], None))
    wrong = exact_law_of_the_first_two_tokens(misread, condition, sampling)
    counts = torch.bincount(theirs[:, 0] * adapter.vocab_size + theirs[:, 1], minlength=adapter.vocab_size ** 2)
    assert chi_square_p_value(counts, wrong) < 1e-6


@pytest.mark.parametrize("window", [2, 5, 9])
def test_end_of_line_lands_on_its_absolute_positions_in_every_decoding(model, window):
    adapter = Emu3Adapter(model, H, W)
    condition = PromptCondition(PROMPTS, negative_ids=NEGATIVE)
    for init in ("random", "horizontal"):
        tokens, _ = run(SJD(window, init), adapter, condition, SamplingConfig(1.0, guidance_scale=2.0),
                        torch.Generator().manual_seed(window))
        grid = tokens.view(3, H, W + 1)
        assert (grid[..., W] == adapter.line_token).all() and (grid[..., :W] < CODES).all(), init


def test_greedy_sjd_equals_greedy_ar(model):
    check_greedy_sjd_equals_ar(Emu3Adapter(model, H, W), PromptCondition(PROMPTS, negative_ids=NEGATIVE), 3.0)


def test_draft_heads_read_emu3_s_features(model):
    check_draft_heads_read_the_family_s_features(Emu3Adapter(model, H, W), PromptCondition(PROMPTS,
                                                                                           negative_ids=NEGATIVE))


def test_cache_equals_a_fresh_prefill_after_every_iteration_and_a_skipped_rollback_is_caught(model):
    ids = torch.cat([torch.tensor([[PAD, BOS, 7, BOI, 8, 9, WRAPPER]]), PROMPTS[1:, 1:]])
    condition = PromptCondition(ids, (ids != PAD).long(), NEGATIVE[:, 1:])
    check_cache_and_its_mutation(Emu3Adapter(model, H, W), condition)


def test_decode_and_lantern_neighbours_from_the_codebook(model):
    adapter = Emu3Adapter(model, H, W)
    tokens = torch.randint(CODES, (2, H, W + 1))
    tokens[..., W] = adapter.line_token
    images = adapter.decode(tokens.flatten(1))
    assert images.shape == (2, 3, 4 * H, 4 * W)
    bpe = adapter.to_bpe(tokens.flatten(1))
    reference = model.decode_image_tokens(image_tokens=torch.cat([bpe, torch.zeros(2, 3, dtype=torch.long)], 1),
                                          height=H, width=W)
    torch.testing.assert_close(images, reference)
    check_lantern_table(adapter)


def test_clear_errors(model):
    with pytest.raises(TypeError, match="must be a transformers Emu3ForConditionalGeneration"):
        Emu3Adapter(torch.nn.Linear(2, 2), H, W)
    with pytest.raises(ValueError, match="width must be a positive int"):
        Emu3Adapter(model, H, 0)
    broken = tiny_emu3()
    broken.config.vq_config.codebook_size = CODES + 2
    with pytest.raises(ValueError, match=r"missing codes \[20, 21\]"):
        Emu3Adapter(broken, H, W)
