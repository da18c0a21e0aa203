"""LlamaGen GPT / VQ: cached multi-token windows and per-row rollback equal a full recompute; official key layout."""

import argparse

import numpy as np
import pytest
import torch

from mmspec.core.trees import DraftTree
from mmspec.models.llamagen.adapter import LlamaGenAdapter, LlamaGenCondition
from mmspec.models.llamagen.gpt import LlamaGenTransformer, rope_table_2d
from mmspec.models.llamagen.vq import LlamaGenVQModel
from tests.models.llamagen_tiny import TEXT_CONTEXT, tiny_transformer, tiny_vq


def t2i_condition(B: int, generator: torch.Generator, dtype=torch.float32):
    states = torch.randn(B, TEXT_CONTEXT, 16, generator=generator, dtype=dtype)
    lengths = torch.randint(1, TEXT_CONTEXT + 1, (B,), generator=generator)
    mask = torch.arange(TEXT_CONTEXT) >= TEXT_CONTEXT - lengths[:, None]  # left padding, as the pipeline lays it out
    return states, mask


@pytest.mark.parametrize("model_type", ["t2i", "c2i"])
def test_cached_windows_and_per_row_rollback_equal_full_recompute(model_type):
    """Windows of 1..5 tokens, with garbage speculation rolled back to a different length per row, give the logits
    of one teacher-forced pass over the final sequence (fp32, within 1e-5)."""
    g = torch.Generator().manual_seed(0)
    model = tiny_transformer(model_type, dtype=torch.float32)
    B, N = 3, model.num_image_tokens
    tokens = torch.randint(0, 24, (B, N), generator=g)
    if model_type == "t2i":
        condition, mask = t2i_condition(B, g)
    else:
        condition, mask = torch.tensor([0, 3, 5]), None  # 5 = the null class
    with torch.no_grad():
        reference = model(tokens, condition, mask)  # [B, N, V]
        cache = model.new_cache(B)
        if mask is not None:
            cache.key_valid[:, :TEXT_CONTEXT] = mask
        T = model.config.cls_token_num
        got = torch.zeros_like(reference)
        got[:, :1] = model.forward_window(model.embed_condition(condition), cache)[:, -1:]
        kept = torch.zeros(B, dtype=torch.long)  # image tokens whose logits are final, per row
        for step, width in enumerate([1, 3, 5, 2, 4, 1, 5]):
            # speculate a window whose first `accepted[b]` tokens are right and the rest garbage, then roll back
            accepted = torch.tensor([(step + b) % (width + 1) for b in range(B)]).clamp(max=N - 1 - kept)
            window = torch.randint(0, 24, (B, width), generator=g)
            cols = kept[:, None] + torch.arange(width)
            truth = tokens.gather(1, cols.clamp(max=N - 1))
            window = torch.where(torch.arange(width) < accepted[:, None], truth, window)
            logits = model.forward_window(model.tok_embeddings(window), cache)
            for b in range(B):
                n = int(accepted[b])
                got[b, kept[b] + 1 : kept[b] + 1 + n] = logits[b, :n]
            kept = kept + accepted
            cache.rollback(T + kept)
    filled = torch.arange(N) <= kept[:, None]
    assert filled.sum() > B * 5
    assert torch.allclose(got[filled], reference[filled], atol=1e-5, rtol=0)


@pytest.mark.parametrize(("model_type", "null_caption_mask"), [("t2i", "prompt"), ("t2i", "all"), ("c2i", "prompt")])
def test_adapter_cfg_rows_match_separate_conditional_and_unconditional_passes(model_type, null_caption_mask):
    """The unconditional twins see the null caption through the prompt's own padding mask (LlamaGen's `generate()`
    and training), or through every slot for a model trained so (`null_caption_mask="all"`)."""
    g = torch.Generator().manual_seed(1)
    model = tiny_transformer(model_type, dtype=torch.float32)
    model.register_to_config(null_caption_mask=null_caption_mask)
    adapter = LlamaGenAdapter(model, tiny_vq(dtype=torch.float32))
    B, N = 3, model.num_image_tokens
    if model_type == "t2i":
        states = torch.randn(B, TEXT_CONTEXT, 16, generator=g)
        mask = torch.arange(TEXT_CONTEXT) >= TEXT_CONTEXT - torch.tensor([2, 4, TEXT_CONTEXT])[:, None]  # left-padded
    else:
        states, mask = torch.tensor([1, 4, 0]), None
    tokens = torch.randint(0, 24, (B, N), generator=g)
    with torch.no_grad():
        state, first = adapter.prefill(LlamaGenCondition(states, mask), cfg=True)
        rest = adapter.forward(tokens[:, : N - 1], state)
        cond = model(tokens, states, mask)
        null = model.unconditional(B, tokens.device)
        uncond = model(tokens, null, model.unconditional_mask(mask))
        uncond_all = model(tokens, null, None)
    assert torch.allclose(torch.cat([first.cond, rest.cond], 1), cond, atol=1e-5, rtol=0)
    assert torch.allclose(torch.cat([first.uncond, rest.uncond], 1), uncond, atol=1e-5, rtol=0)
    assert not torch.allclose(cond, uncond, atol=1e-2)
    if model_type == "t2i":
        T = TEXT_CONTEXT
        null_keys = state.cache.key_valid[B:, :T]
        assert torch.equal(null_keys, mask if null_caption_mask == "prompt" else torch.ones_like(mask))
        # the conventions differ for padded prompts only: rows 0, 1 are padded, row 2 fills the context
        differ = (uncond - uncond_all).abs().amax(dim=(1, 2))
        assert (differ[:2] > 1e-2).all() == (null_caption_mask == "prompt") and differ[2] < 1e-5


def test_training_drops_captions_under_the_model_s_null_caption_mask():
    """A dropped caption (CFG training) is the null caption seen through the convention the model samples with."""
    g = torch.Generator().manual_seed(2)
    model = tiny_transformer("t2i", dtype=torch.float32)
    states = torch.randn(2, TEXT_CONTEXT, 16, generator=g)
    mask = torch.arange(TEXT_CONTEXT) >= TEXT_CONTEXT - torch.tensor([2, 3])[:, None]
    tokens = torch.randint(0, 24, (2, model.num_image_tokens), generator=g)
    drop = torch.tensor([True, False])
    for convention in ("prompt", "all"):
        model.register_to_config(null_caption_mask=convention)
        with torch.no_grad():
            trained = model(tokens, states, mask, drop)
            null = model(tokens[:1], model.unconditional(1, tokens.device), model.unconditional_mask(mask[:1]))
            kept = model(tokens[1:], states[1:], mask[1:])
        assert torch.allclose(trained[:1], null, atol=1e-5) and torch.allclose(trained[1:], kept, atol=1e-5)


def test_per_row_trees_grown_over_two_calls_attend_along_each_path():
    """Per-row trees (CFG) appended in two forward_tree calls, the second attending to the first's nodes, give each
    node the logits of its path fed as a chain; keep_path and a rollback then leave exactly the kept path."""
    g = torch.Generator().manual_seed(2)
    model = tiny_transformer("c2i", dtype=torch.float32)
    adapter = LlamaGenAdapter(model, tiny_vq(dtype=torch.float32))
    labels = torch.tensor([1, 4])
    prefix = torch.randint(0, 24, (2, 3), generator=g)
    parent = torch.tensor([[-1, -1, 0, 0, 2, 1], [-1, 0, 1, 1, 0, 3]])  # node -> parent node, -1 = the root
    tree = DraftTree(torch.randint(0, 24, (2, 6), generator=g), parent, torch.ones(2, 6, dtype=torch.bool), None,
                     "deterministic")
    layout = tree.layout()
    window = torch.cat([prefix[:, -1:], tree.tokens], 1)  # slot 0, the root, is the prefix's last token

    def chain(row, tokens):  # logits [2 (cond, uncond), V] after prefix[row, :-1] + tokens, fed as one chain
        state, _ = adapter.prefill(LlamaGenCondition(labels[row : row + 1]), cfg=True, max_window=8)
        logits = adapter.forward(torch.cat([prefix[row, :-1], tokens])[None], state)
        return torch.stack([logits.cond[0, -1], logits.uncond[0, -1]])

    with torch.no_grad():
        state, _ = adapter.prefill(LlamaGenCondition(labels), cfg=True, max_window=8)
        adapter.forward(prefix[:, :-1], state)
        first = adapter.forward_tree(window[:, :4], layout.depth[:, :4], layout.ancestors[:, :4, :4], state)
        second = adapter.forward_tree(window[:, 4:], layout.depth[:, 4:], layout.ancestors[:, 4:], state)
        cond, uncond = (torch.cat([a, b], 1) for a, b in ((first.cond, second.cond), (first.uncond, second.uncond)))
        for row in range(2):
            for slot in range(7):
                path = layout.ancestors[row, slot].nonzero().flatten()  # slots in topological order = by depth
                expected = chain(row, window[row, path])
                assert torch.allclose(torch.stack([cond[row, slot], uncond[row, slot]]), expected, atol=1e-5)
        path = torch.tensor([[1, 3, 5], [1, 2, -1]])  # the kept path's slots by level, -1 past it
        adapter.keep_path(state, path)
        adapter.rollback(state, torch.tensor([6, 5]))  # prefix, root, then the path
        nxt = torch.randint(0, 24, (2, 1), generator=g)
        after = adapter.forward(nxt, state)
        for row, kept in enumerate(([1, 3, 5], [1, 2])):
            expected = chain(row, torch.cat([window[row, [0, *kept]], nxt[row]]))
            assert torch.allclose(torch.stack([after.cond[row, -1], after.uncond[row, -1]]), expected, atol=1e-5)


# ---- official checkpoints -----------------------------------------------------------------------------------------
def official_gpt_keys(n_layer: int, model_type: str) -> set[str]:
    """Parameter names of LlamaGen's autoregressive/models/gpt.py `Transformer`, written out independently."""
    keys = {"tok_embeddings.weight", "norm.weight", "output.weight"}
    if model_type == "c2i":
        keys.add("cls_embedding.embedding_table.weight")
    else:
        keys |= {"cls_embedding.cap_proj.fc1.weight", "cls_embedding.cap_proj.fc2.weight",
                 "cls_embedding.uncond_embedding"}
    for i in range(n_layer):
        keys |= {f"layers.{i}.{name}.weight" for name in ("attention.wqkv", "attention.wo", "feed_forward.w1",
                                                          "feed_forward.w2", "feed_forward.w3", "attention_norm",
                                                          "ffn_norm")}
    return keys


def official_vq_keys(ch_mult: tuple[int, ...], num_res_blocks: int, ch: int) -> set[str]:
    """Parameter names of LlamaGen's tokenizer/tokenizer_image/vq_model.py `VQModel`, written out independently."""
    def conv(prefix):
        return {f"{prefix}.weight", f"{prefix}.bias"}

    def res(prefix, shortcut):
        keys = set().union(*(conv(f"{prefix}.{n}") for n in ("norm1", "conv1", "norm2", "conv2")))
        return keys | (conv(f"{prefix}.nin_shortcut") if shortcut else set())

    def attn(prefix):
        return set().union(*(conv(f"{prefix}.{n}") for n in ("norm", "q", "k", "v", "proj_out")))

    keys = {"quantize.embedding.weight", "quantize.codebook_used"} | conv("quant_conv") | conv("post_quant_conv")
    levels = len(ch_mult)
    for part in ("encoder", "decoder"):
        keys |= conv(f"{part}.conv_in") | conv(f"{part}.norm_out") | conv(f"{part}.conv_out")
        keys |= res(f"{part}.mid.0", False) | attn(f"{part}.mid.1") | res(f"{part}.mid.2", False)
    block_in = ch
    for i, mult in enumerate(ch_mult):
        for j in range(num_res_blocks):
            keys |= res(f"encoder.conv_blocks.{i}.res.{j}", block_in != ch * mult)
            block_in = ch * mult
            if i == levels - 1:
                keys |= attn(f"encoder.conv_blocks.{i}.attn.{j}")
        if i != levels - 1:
            keys |= conv(f"encoder.conv_blocks.{i}.downsample.conv")
    for k, i in enumerate(reversed(range(levels))):
        for j in range(num_res_blocks + 1):
            keys |= res(f"decoder.conv_blocks.{k}.res.{j}", block_in != ch * ch_mult[i])
            block_in = ch * ch_mult[i]
            if i == levels - 1:
                keys |= attn(f"decoder.conv_blocks.{k}.attn.{j}")
        if i != 0:
            keys |= conv(f"decoder.conv_blocks.{k}.upsample.conv")
    return keys


def save_official(path, state: dict, wrapper: str = "model") -> None:
    """As LlamaGen's training scripts save: weights beside the optimiser state, step count and argparse args."""
    torch.save({wrapper: state, "optimizer": {}, "steps": 10, "args": argparse.Namespace(gpt_model="tiny")}, path)


@pytest.mark.parametrize("model_type", ["c2i", "t2i"])
def test_gpt_loads_official_key_layout(tmp_path, model_type):
    source = tiny_transformer(model_type, dtype=torch.float32)
    state = {k: torch.randn_like(v) for k, v in source.state_dict().items()}
    assert set(state) == official_gpt_keys(2, model_type)
    assert state["layers.0.feed_forward.w1.weight"].shape == (96, 32)  # find_multiple(int(2 * 4 * 32 / 3), 16)
    assert state["layers.0.attention.wqkv.weight"].shape == ((4 + 2 * 2) * 8, 32)  # 4 query heads, 2 kv heads
    save_official(tmp_path / "gpt.pt", {f"module.{k}" if model_type == "t2i" else k: v for k, v in state.items()},
                  wrapper="model" if model_type == "c2i" else "ema")
    weights = None if model_type == "c2i" else "ema"
    loaded = LlamaGenTransformer.from_llamagen_checkpoint(tmp_path / "gpt.pt", image_size=64, downsample=16,
                                                          weights=weights, n_head=4, n_kv_head=2, multiple_of=16)
    c = loaded.config
    assert (c.model_type, c.dim, c.n_layer, c.vocab_size, c.grid_size) == (model_type, 32, 2, 24, 4)
    assert (c.num_classes if model_type == "c2i" else c.cls_token_num) == (5 if model_type == "c2i" else TEXT_CONTEXT)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in state.items())


def test_official_gpt_sizes_infer_heads_from_width(tmp_path):
    """A GPT-B-width checkpoint needs no n_head (768 -> 12 heads); an unofficial width asks for it."""
    from mmspec.models.llamagen.gpt import OFFICIAL_SIZES

    assert OFFICIAL_SIZES["GPT-B"] == (768, 12, 12) and OFFICIAL_SIZES["GPT-XL"] == (1280, 36, 20)
    model = LlamaGenTransformer(vocab_size=8, dim=768, n_layer=1, n_head=12, num_classes=2, grid_size=2)
    save_official(tmp_path / "b.pt", model.state_dict())
    assert LlamaGenTransformer.from_llamagen_checkpoint(tmp_path / "b.pt", image_size=32).config.n_head == 12
    save_official(tmp_path / "tiny.pt", tiny_transformer("c2i", dtype=torch.float32).state_dict())
    with pytest.raises(ValueError, match="n_head"):
        LlamaGenTransformer.from_llamagen_checkpoint(tmp_path / "tiny.pt", image_size=64)


def test_vq_loads_official_key_layout(tmp_path):
    config = {"ch": 32, "ch_mult": (1, 2), "num_res_blocks": 1, "z_channels": 32}
    source = LlamaGenVQModel(codebook_size=24, codebook_embed_dim=4, **config)
    state = {k: torch.randn_like(v) for k, v in source.state_dict().items()}
    state["quantize.codebook_used"] = torch.zeros(65536)  # the official training-time usage buffer
    assert set(state) == official_vq_keys((1, 2), 1, 32)
    save_official(tmp_path / "vq.pt", state)
    loaded = LlamaGenVQModel.from_llamagen_checkpoint(tmp_path / "vq.pt", **config)
    assert (loaded.config.codebook_size, loaded.config.codebook_embed_dim) == (24, 4)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in state.items() if k != "quantize.codebook_used")


def test_checkpoint_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="not a file"):
        LlamaGenVQModel.from_llamagen_checkpoint(tmp_path / "missing.pt")
    save_official(tmp_path / "vq_as_gpt.pt", {"quantize.embedding.weight": torch.zeros(4, 2)})
    with pytest.raises(ValueError, match="not a LlamaGen GPT checkpoint"):
        LlamaGenTransformer.from_llamagen_checkpoint(tmp_path / "vq_as_gpt.pt")


# ---- architecture details -----------------------------------------------------------------------------------------
def test_rope_table_zero_prefix_then_row_and_column_angles():
    table = rope_table_2d(grid_size=3, head_dim=8, base=10000.0, cls_token_num=2)  # [2 + 9, 4, 2]
    assert table.shape == (11, 4, 2) and table[:2].abs().sum() == 0
    freqs = 1.0 / 10000 ** (torch.tensor([0.0, 2.0]) / 4)
    row, col = 2, 1  # image token 7 = grid cell (2, 1)
    angles = torch.cat([row * freqs, col * freqs])
    assert torch.allclose(table[2 + 7], torch.stack([angles.cos(), angles.sin()], -1))


def test_constructor_and_condition_errors():
    with pytest.raises(ValueError, match="model_type"):
        LlamaGenTransformer(model_type="i2i")
    with pytest.raises(ValueError, match="cls_token_num"):
        LlamaGenTransformer(model_type="c2i", cls_token_num=4, dim=32, n_head=4, n_layer=1, vocab_size=8)
    model = tiny_transformer("t2i")
    with pytest.raises(ValueError, match="t2i condition"):
        model.embed_condition(torch.zeros(2, TEXT_CONTEXT + 1, 16, dtype=torch.float64))
    cache = model.new_cache(1)
    with pytest.raises(ValueError, match="overflows"):
        model.forward_window(torch.zeros(1, TEXT_CONTEXT + model.num_image_tokens + 1, 32, dtype=torch.float64), cache)


def test_vq_nearest_code_round_trip_and_decode_shapes():
    vq = tiny_vq()
    codes = vq.quantize.codebook()  # [24, 4], unit norm
    assert torch.allclose(codes.norm(dim=-1), torch.ones(24, dtype=codes.dtype))
    latents = codes[torch.arange(24)[:16]].T.reshape(1, 4, 4, 4)  # 16 codes laid out on a 4x4 grid
    assert torch.equal(vq.quantize_latents(latents), torch.arange(16)[None])
    assert torch.allclose(vq.codes_to_latents(torch.arange(16)[None], (4, 4)), latents)
    images = vq.decode(torch.arange(16)[None], (4, 4))
    assert images.shape == (1, 3, 8, 8) and vq.encode(images).shape == (1, 16)
    with pytest.raises(ValueError, match=r"\[B, 16\]"):
        vq.decode(torch.arange(15)[None], (4, 4))
    with pytest.raises(ValueError, match="ids must be in"):
        vq.decode(torch.full((1, 16), 24), (4, 4))


RELEASE_GPT = {"n_head": 4, "n_kv_head": 2, "multiple_of": 16}  # what a tiny GPT's width cannot tell
RELEASE_VQ = {"ch": 32, "ch_mult": (1, 1), "num_res_blocks": 1, "z_channels": 32}


def write_release(folder, reference=None, drop: str | None = None) -> None:
    """LlamaGen's t2i release as its scripts write it, into `folder`: the GPT `.pt` with its training extras (an EMA
    copy beside "model", a KV cache saved after sampling), the VQ `.pt` with its codebook-usage counter, and a T5
    folder. reference: the tiny pipeline whose weights are written (None: a GPT-B-width one-layer GPT, whose head
    count the loader infers, beside the tiny VQ and T5); drop: a GPT weight left out."""
    from tests.models.llamagen_tiny import tiny_text_encoder, tiny_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    if reference is None:
        torch.manual_seed(0)
        gpt = LlamaGenTransformer(vocab_size=24, dim=768, n_layer=1, n_head=12, model_type="t2i", caption_dim=16,
                                  cls_token_num=TEXT_CONTEXT, grid_size=4).half()
        vq, encoder, tokenizer = tiny_vq(dtype=torch.float32), tiny_text_encoder(dtype=torch.float32), tiny_tokenizer()
    else:
        gpt, vq = reference.transformer, reference.vqvae
        encoder, tokenizer = reference.text_encoder, reference.tokenizer
    weights = {k: v for k, v in gpt.state_dict().items() if k != drop}
    cache = {f"layers.{i}.attention.kv_cache.{name}": torch.zeros(2, 1, 8, 4) for i in range(gpt.config.n_layer)
             for name in ("k_cache", "v_cache")}
    ema = {k: torch.zeros_like(v) for k, v in weights.items()}
    torch.save({"model": {**weights, **cache}, "ema": ema, "optimizer": {}, "steps": 10,
                "args": argparse.Namespace(gpt_model="GPT-B")}, folder / f"t2i_tiny_{4 * 16}.pt")
    save_official(folder / "vq_ds16_t2i.pt", {**vq.state_dict(), "quantize.codebook_used": torch.zeros(65536)})
    encoder.save_pretrained(folder / "flan-t5-xl")
    tokenizer.save_pretrained(folder / "flan-t5-xl")


def test_official_t2i_release_loads_into_the_pipeline_with_a_pluggable_t5(tmp_path, caplog):
    """The official t2i files (GPT .pt, VQ .pt, a T5 folder) assemble a LlamaGenPipeline that generates what the same
    weights do in code: the "model" weights (the EMA copy on request), the files' extras ignored and logged; a c2i
    GPT, a GPT or VQ file missing a weight and a file with an unknown entry are refused with the reason."""
    import logging

    from mmspec.pipelines.auto import AutoARImagePipeline
    from mmspec.pipelines.llamagen import LlamaGenPipeline
    from tests.models.llamagen_tiny import tiny_pipeline

    reference = tiny_pipeline(dtype=torch.float32)
    release = tmp_path / "release"
    write_release(release, reference)
    gpt, vq = release / "t2i_tiny_64.pt", release / "vq_ds16_t2i.pt"
    with caplog.at_level(logging.INFO, logger="mmspec.models.checkpoint"):
        pipe = LlamaGenPipeline.from_llamagen_checkpoints(gpt, vq, release / "flan-t5-xl", image_size=64,
                                                          gpt_config=RELEASE_GPT, vq_config=RELEASE_VQ)
    assert "ignored 4 entries that are not LlamaGenTransformer weights: layers.0.attention.kv_cache.k_cache" \
        in caplog.text
    assert "ignored 1 entries that are not LlamaGenVQModel weights: quantize.codebook_used" in caplog.text
    # the release as a folder (names as published): one from_pretrained, through the auto registry too
    from_folder = AutoARImagePipeline.from_pretrained(release, gpt_config=RELEASE_GPT, vq_config=RELEASE_VQ)
    assert isinstance(from_folder, LlamaGenPipeline) and from_folder.native_size == 8
    reference.set_progress_bar_config(disable=True)
    prompts = ["a red circle", "a blue square on the left"]
    b = reference(prompts, generator=torch.Generator().manual_seed(0), output_type="np", decoding="sjd").images
    for loaded in (pipe, from_folder):
        loaded.set_progress_bar_config(disable=True)
        images = loaded(prompts, generator=torch.Generator().manual_seed(0), output_type="np", decoding="sjd").images
        assert np.array_equal(images, b)
    ema = LlamaGenTransformer.from_llamagen_checkpoint(gpt, image_size=64, weights="ema", **RELEASE_GPT)
    assert all(v.abs().sum() == 0 for v in ema.state_dict().values())
    with pytest.raises(ValueError, match=r"^weights='model_ema': t2i_tiny_64.pt has no such entry; its weight "
                                         r"entries are \['ema', 'model', 'optimizer'\]$"):
        LlamaGenTransformer.from_llamagen_checkpoint(gpt, image_size=64, weights="model_ema", **RELEASE_GPT)
    save_official(tmp_path / "c2i.pt", tiny_transformer("c2i", dtype=torch.float32).state_dict())
    with pytest.raises(ValueError, match="class-conditional"):
        LlamaGenPipeline.from_llamagen_checkpoints(tmp_path / "c2i.pt", vq, release / "flan-t5-xl", image_size=64,
                                                   gpt_config=RELEASE_GPT, vq_config=RELEASE_VQ)
    save_official(tmp_path / "encoder_only.pt", {k: v for k, v in reference.vqvae.state_dict().items()
                                                 if not k.startswith("decoder.")})
    with pytest.raises(ValueError, match=r"lacks \d+ weight\(s\) of this LlamaGenVQModel: decoder\."):
        LlamaGenVQModel.from_llamagen_checkpoint(tmp_path / "encoder_only.pt", **RELEASE_VQ)
    cut = tmp_path / "cut"
    write_release(cut, reference, drop="cls_embedding.uncond_embedding")
    with pytest.raises(ValueError, match=r"t2i_tiny_64.pt lacks 1 weight\(s\) of this LlamaGenTransformer: "
                                         r"cls_embedding.uncond_embedding$"):
        LlamaGenPipeline.from_pretrained(cut, gpt_config=RELEASE_GPT, vq_config=RELEASE_VQ)
    save_official(tmp_path / "lora.pt", {**reference.transformer.state_dict(), "lora.A": torch.zeros(2)})
    with pytest.raises(ValueError, match="lora.pt has 1 entry this LlamaGenTransformer does not have: lora.A"):
        LlamaGenTransformer.from_llamagen_checkpoint(tmp_path / "lora.pt", image_size=64, **RELEASE_GPT)
