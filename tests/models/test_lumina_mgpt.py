"""Lumina-mGPT on a tiny random Chameleon (built in code, offline): the adapter's AR equals the official loop —
`generate` with our ports of its image-start-triggered CFG, image structure and image top-k processors — token for
token (greedy) and in law (sampled); new-lines land on their absolute positions in every decoding; greedy SJD = AR; the
batched-CFG cache equals a fresh prefill after every iteration; the VQGAN decoder is taming's (checked against
diffusers' VQModel decoder) and loads Meta's checkpoint layout; LANTERN table; errors."""

import pytest
import torch

from mmspec.core.probs import SamplingConfig
from mmspec.image import AR, SJD
from mmspec.models.chameleon_vqgan import ChameleonVQGAN
from mmspec.models.hf_image import PromptCondition
from mmspec.models.lumina_mgpt import (
    LuminaMGPTAdapter,
    LuminaMGPTForConditionalGeneration,
    lumina_logits_processors,
    supported_sizes,
)
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

CODES, H, W = 16, 2, 4  # 2 x 4 VQ tokens = 1 x 2 patches
PAD, BOS, EOS, START, END, NEW_LINE, SEP, ONE_PATCH, TWO_PATCHES = 0, 1, 2, 31, 32, 33, 34, 35, 36
VQGAN = dict(n_embed=CODES, embed_dim=8, z_channels=32, ch=32, ch_mult=(1, 2), num_res_blocks=1,
             attn_resolutions=(8,), resolution=16)


def image_token_name(code: int) -> str:
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


def tiny_lumina(seed: int = 0):
    vocab = {f"w{i}": i for i in range(3, 30)}
    vocab.update({"<pad>": PAD, "<s>": BOS, "</s>": EOS, "<image>": 30, "<racm3:break>": START, "<eoss>": END,
                  "<reserved08799>": NEW_LINE, "<reserved08706>": SEP, "<reserved08801>": ONE_PATCH,
                  "<reserved08802>": TWO_PATCHES})
    return tiny_chameleon(vocab, vocab_size=64, codes=CODES, first_image_id=40, seed=seed)


def tiny_chameleon(vocab: dict[str, int], vocab_size: int, codes: int, first_image_id: int, seed: int = 0,
                   pad: int = PAD, bos: int = BOS, eos: int = EOS):
    """(a tiny random Lumina-mGPT, its VQGAN) over `vocab` plus `codes` image tokens from `first_image_id` on, in
    an order other than the codes' (as Chameleon's BPE ids are)."""
    from transformers import ChameleonConfig

    shuffled = torch.randperm(codes, generator=torch.Generator().manual_seed(1))  # BPE order != code order
    vocab = {**vocab, **{image_token_name(int(code)): first_image_id + i for i, code in enumerate(shuffled)}}
    config = ChameleonConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, pad_token_id=pad, bos_token_id=bos, eos_token_id=eos,
        vq_config={"embed_dim": 8, "num_embeddings": codes, "latent_channels": 8, "base_channels": 32,
                   "channel_multiplier": [1, 2]},
        vocabulary_map=vocab)
    torch.manual_seed(seed)
    return LuminaMGPTForConditionalGeneration(config).eval(), ChameleonVQGAN(**{**VQGAN, "n_embed": codes}).eval()


@pytest.fixture(scope="module")
def model():
    return tiny_lumina()


SUFFIX = [START, ONE_PATCH, TWO_PATCHES]
PROMPTS = torch.tensor([[BOS, 5, 6, 7, SEP, *SUFFIX], [BOS, 10, 11, 12, SEP, *SUFFIX], [BOS, 13, 5, 14, SEP, *SUFFIX]])


def official_loop(model, prompts, new_tokens, guidance, **kwargs):
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=new_tokens, top_k=None, eos_token_id=[EOS], pad_token_id=PAD, **kwargs)
    with torch.no_grad():
        out = model.generate(prompts, config, attention_mask=torch.ones_like(prompts),
                             logits_processor=lumina_logits_processors(model, guidance, image_top_k=6))
    return out[:, prompts.shape[1] :]


def test_greedy_ar_equals_the_official_loop(model):
    lm, vqgan = model
    adapter = LuminaMGPTAdapter(lm, vqgan, H, W)
    assert adapter.grid == (H, W + 1) and adapter.vocab_size == CODES + 1
    for guidance in (1.0, 4.0):
        ours, stats = run(AR(), adapter, PromptCondition(PROMPTS), SamplingConfig(0, guidance_scale=guidance))
        theirs = official_loop(lm, PROMPTS, H * (W + 1) + 1, guidance, do_sample=False)
        assert torch.equal(adapter.to_bpe(ours), theirs[:, : H * (W + 1)]), guidance
        assert (theirs[:, -1] == END).all() and stats.target_forwards == H * (W + 1)


def test_transformers_chameleon_itself_cannot_write_images(model):
    """Why the adapter reads the LM head itself: transformers' Chameleon floors every image-token logit."""
    from transformers import ChameleonForConditionalGeneration

    lm, _ = model
    stock = ChameleonForConditionalGeneration(lm.config).eval()
    stock.load_state_dict(lm.state_dict())
    with torch.no_grad():
        logits = stock(PROMPTS[:1]).logits[0, -1]
    assert (logits[lm.model.vocabulary_mapping.image_tokens] == torch.finfo(logits.dtype).min).all()


def test_sampled_ar_and_the_official_loop_follow_the_same_law(model):
    lm, vqgan = model
    adapter, rows = LuminaMGPTAdapter(lm, vqgan, H, W), 4000
    sampling = SamplingConfig(1.0, top_k=6, guidance_scale=3.0)
    law = exact_law_of_the_first_two_tokens(adapter, PromptCondition(PROMPTS[:1]), sampling)
    no_cfg = exact_law_of_the_first_two_tokens(adapter, PromptCondition(PROMPTS[:1]), SamplingConfig(1.0, top_k=6))
    ours, _ = run(AR(), adapter, PromptCondition(PROMPTS[:1].expand(rows, -1)), sampling,
                  torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    theirs = official_loop(lm, PROMPTS[:1].expand(rows, -1), 2, 3.0, do_sample=True)
    V = adapter.vocab_size
    check_first_two_tokens_follow(law, ours, V, wrong_law=no_cfg)
    check_first_two_tokens_follow(law, from_bpe(adapter, theirs), V, wrong_law=no_cfg)


@pytest.mark.parametrize("window", [2, 5, 9])
def test_new_lines_land_on_their_absolute_positions_in_every_decoding(model, window):
    adapter = LuminaMGPTAdapter(*model, H, W)
    for init in ("random", "vertical"):
        tokens, _ = run(SJD(window, init), adapter, PromptCondition(PROMPTS),
                        SamplingConfig(1.0, top_k=8, guidance_scale=3.0), torch.Generator().manual_seed(window))
        grid = tokens.view(3, H, W + 1)
        assert (grid[..., W] == adapter.line_token).all() and (grid[..., :W] < CODES).all(), init


def test_greedy_sjd_equals_greedy_ar(model):
    check_greedy_sjd_equals_ar(LuminaMGPTAdapter(*model, H, W), PromptCondition(PROMPTS), 4.0)


def test_draft_heads_read_lumina_mgpt_s_features(model):
    check_draft_heads_read_the_family_s_features(LuminaMGPTAdapter(*model, H, W), PromptCondition(PROMPTS), 4.0)


def test_cache_equals_a_fresh_prefill_after_every_iteration_and_a_skipped_rollback_is_caught(model):
    ids = torch.cat([torch.tensor([[PAD, PAD, BOS, 7, SEP, *SUFFIX]]), PROMPTS[1:]])
    check_cache_and_its_mutation(LuminaMGPTAdapter(*model, H, W), PromptCondition(ids, (ids != PAD).long()))


def taming_to_diffusers(state: dict, levels: int) -> dict:
    """Meta's / taming's VQGAN decoder names -> diffusers' VQModel names (an independent implementation)."""
    out = {}
    for key, value in state.items():
        new = key.replace("decoder.mid.block_1.", "decoder.mid_block.resnets.0.")
        new = new.replace("decoder.mid.block_2.", "decoder.mid_block.resnets.1.")
        new = new.replace("decoder.mid.attn_1.", "decoder.mid_block.attentions.0.")
        for level in range(levels):
            new = new.replace(f"decoder.up.{level}.block.", f"decoder.up_blocks.{levels - 1 - level}.resnets.")
            new = new.replace(f"decoder.up.{level}.attn.", f"decoder.up_blocks.{levels - 1 - level}.attentions.")
            new = new.replace(f"decoder.up.{level}.upsample.", f"decoder.up_blocks.{levels - 1 - level}.upsamplers.0.")
        new = new.replace("nin_shortcut", "conv_shortcut").replace("decoder.norm_out", "decoder.conv_norm_out")
        if "attentions" in new:
            new = new.replace(".norm.", ".group_norm.").replace(".q.", ".to_q.").replace(".k.", ".to_k.")
            new = new.replace(".v.", ".to_v.").replace(".proj_out.", ".to_out.0.")
            value = value.flatten(1) if value.ndim == 4 else value  # 1x1 conv -> linear
        out[new] = value
    return out


def test_vqgan_decoder_is_taming_s_and_loads_meta_s_checkpoint_layout(tmp_path):
    from diffusers import VQModel

    torch.manual_seed(0)
    ours = ChameleonVQGAN(**VQGAN).eval()
    reference = VQModel(in_channels=3, out_channels=3, latent_channels=32, num_vq_embeddings=CODES, vq_embed_dim=8,
                        block_out_channels=(32, 64), layers_per_block=1, norm_num_groups=32,
                        down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("AttnUpDecoderBlock2D", "UpDecoderBlock2D"))  # attention at the 8x8 level only
    decoder_state = taming_to_diffusers(ours.state_dict(), levels=2)
    missing, unexpected = reference.load_state_dict(decoder_state, strict=False)
    assert not unexpected and all(key.startswith(("encoder.", "quant_conv.")) for key in missing)
    codes = torch.randint(CODES, (2, 3, 5))
    with torch.no_grad():
        quant = ours.quantize.embedding(codes).permute(0, 3, 1, 2)
        torch.testing.assert_close(ours.decode(codes), reference.decode(quant, force_not_quantize=True).sample,
                                   rtol=1e-4, atol=1e-4)
    # Meta's file: a Lightning checkpoint with the whole VQGAN (encoder, loss) under "state_dict", plus its yaml
    encoder = {"encoder.conv_in.weight": torch.zeros(32, 3, 3, 3), "loss.logvar": torch.zeros(())}
    torch.save({"state_dict": {**ours.state_dict(), **encoder}}, tmp_path / "vqgan.ckpt")
    (tmp_path / "vqgan.yaml").write_text(
        "model:\n  params:\n    embed_dim: 8\n    n_embed: 16\n    ddconfig:\n      double_z: false\n"
        "      z_channels: 32\n      resolution: 16\n      in_channels: 3\n      out_ch: 3\n      ch: 32\n"
        "      ch_mult: [1, 2]\n      num_res_blocks: 1\n      attn_resolutions: [8]\n      dropout: 0.0\n")
    loaded = ChameleonVQGAN.from_chameleon_checkpoint(tmp_path / "vqgan.ckpt", tmp_path / "vqgan.yaml")
    with torch.no_grad():
        assert torch.equal(loaded.decode(codes), ours.decode(codes))
    torch.save({"state_dict": {k: v for k, v in ours.state_dict().items() if k != "decoder.conv_out.bias"}},
               tmp_path / "broken.ckpt")
    with pytest.raises(ValueError, match=r"lacks 1 VQ decoder weight\(s\), e.g. \['decoder.conv_out.bias'\]"):
        ChameleonVQGAN.from_chameleon_checkpoint(tmp_path / "broken.ckpt", tmp_path / "vqgan.yaml")
    with pytest.raises(ValueError, match="lacks 98 VQ decoder weight"):  # Chameleon's full-size default layout
        ChameleonVQGAN.from_chameleon_checkpoint(tmp_path / "vqgan.ckpt")
    (tmp_path / "other.yaml").write_text((tmp_path / "vqgan.yaml").read_text().replace("n_embed: 16", "n_embed: 32"))
    with pytest.raises(ValueError, match=r"\['quantize.embedding.weight'\] have shapes \[\(16, 8\)\]"):
        ChameleonVQGAN.from_chameleon_checkpoint(tmp_path / "vqgan.ckpt", tmp_path / "other.yaml")


def test_decode_and_lantern_neighbours_from_the_codebook(model):
    adapter = LuminaMGPTAdapter(*model, H, W)
    tokens = torch.randint(CODES, (2, H, W + 1))
    tokens[..., W] = adapter.line_token
    assert adapter.decode(tokens.flatten(1)).shape == (2, 3, 2 * H, 2 * W)
    check_lantern_table(adapter)


def test_supported_sizes_are_lumina_s_crop_list():
    sizes = supported_sizes(768)
    assert (768, 768) in sizes and all(h % 32 == 0 and w % 32 == 0 and h * w <= 768 * 768 for h, w in sizes)
    assert all(max(h, w) / min(h, w) <= 4 for h, w in sizes) and (1024, 1024) not in sizes


def test_clear_errors(model):
    lm, vqgan = model
    with pytest.raises(TypeError, match="must be a transformers ChameleonForConditionalGeneration"):
        LuminaMGPTAdapter(torch.nn.Linear(2, 2), vqgan, H, W)
    with pytest.raises(ValueError, match="height must be an even int"):
        LuminaMGPTAdapter(lm, vqgan, 3, W)
    with pytest.raises(ValueError, match="no grid token <reserved08803>"):
        LuminaMGPTAdapter(lm, vqgan, 6, W)
    with pytest.raises(ValueError, match="does not belong to this model"):
        LuminaMGPTAdapter(lm, ChameleonVQGAN(**{**VQGAN, "n_embed": CODES + 4}), H, W)
    with pytest.raises(ValueError, match="must end with the image-start and grid tokens"):
        LuminaMGPTAdapter(lm, vqgan, H, W).prefill(PromptCondition(PROMPTS[:, :-1]), cfg=True)
