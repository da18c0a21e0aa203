import pytest
import torch

from mmspec.models.mar import MARModel

TINY = dict(seq_len=16, token_dim=4, num_classes=10, buffer_size=4, encoder_embed_dim=32, encoder_depth=2,
            encoder_num_heads=4, decoder_embed_dim=32, decoder_depth=2, decoder_num_heads=4, diffloss_d=2,
            diffloss_w=48)


def tiny_mar(seed: int = 0) -> MARModel:
    torch.manual_seed(seed)
    model = MARModel(**TINY).eval()
    with torch.no_grad():  # the official init zeroes the position embeddings, mask token and adaLN outputs
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model


@pytest.mark.parametrize("name,millions", [("mar_base", 208), ("mar_large", 479), ("mar_huge", 943)])
def test_official_sizes_have_the_published_parameter_counts(name, millions):
    with torch.device("meta"):
        model = MARModel.preset(name)
    assert abs(sum(p.numel() for p in model.parameters()) / 1e6 - millions) < 1.0


def test_parameter_names_are_the_official_ones():
    names = set(MARModel(**TINY).state_dict())
    official = {
        "class_emb.weight", "fake_latent", "z_proj.weight", "z_proj_ln.bias", "encoder_pos_embed_learned",
        "encoder_blocks.1.norm1.weight", "encoder_blocks.1.attn.qkv.weight", "encoder_blocks.1.attn.proj.bias",
        "encoder_blocks.1.mlp.fc1.weight", "encoder_blocks.1.mlp.fc2.bias", "encoder_norm.weight",
        "decoder_embed.weight", "mask_token", "decoder_pos_embed_learned", "decoder_blocks.0.norm2.bias",
        "decoder_norm.weight", "diffusion_pos_embed_learned", "diffloss.net.time_embed.mlp.0.weight",
        "diffloss.net.time_embed.mlp.2.bias", "diffloss.net.cond_embed.weight", "diffloss.net.input_proj.weight",
        "diffloss.net.res_blocks.1.in_ln.weight", "diffloss.net.res_blocks.1.mlp.0.weight",
        "diffloss.net.res_blocks.1.mlp.2.bias", "diffloss.net.res_blocks.1.adaLN_modulation.1.weight",
        "diffloss.net.final_layer.linear.weight", "diffloss.net.final_layer.adaLN_modulation.1.bias",
    }
    assert official <= names
    assert not any("norm_final" in n for n in names)  # the head's final LayerNorm has no affine parameters


def test_encoder_decoder_reads_known_tokens_only():
    model = tiny_mar()
    B, L, C = 2, 16, 4
    tokens = torch.randn(B, L, C)
    mask = torch.zeros(B, L, dtype=torch.bool)
    mask[0, 5:] = True
    mask[1, torch.tensor([0, 2, 4, 6, 8, 9, 10, 11, 12, 13, 14])] = True  # 5 known tokens per row
    label = model.class_embedding(torch.tensor([3, 7]), B)
    z = model.encode_decode(tokens, mask, label)
    assert z.shape == (B, L, 32)
    other = tokens.clone()
    other[mask] = torch.randn(int(mask.sum()), C)  # unknown tokens' values are never read
    assert torch.allclose(model.encode_decode(other, mask, label), z, atol=1e-6)
    other = tokens.clone()
    other[0, 1] += 1.0  # a known token changes every position (bidirectional)
    changed = (model.encode_decode(other, mask, label) - z).abs().amax(-1)
    assert (changed[0] > 1e-4).all() and (changed[1] < 1e-6).all()
    unconditional = model.encode_decode(tokens, mask, model.class_embedding(None, B))
    assert not torch.allclose(unconditional, z)
    out = model.head(torch.randn(5, C), torch.tensor([0, 10, 500, 999, 3]), z[0, :5])
    assert out.shape == (5, 2 * C)


def test_rows_need_equal_numbers_of_known_tokens():
    model = tiny_mar()
    mask = torch.zeros(2, 16, dtype=torch.bool)
    mask[0, :3] = True
    with pytest.raises(ValueError, match="same number of known tokens"):
        model.encode_decode(torch.randn(2, 16, 4), mask, model.class_embedding(None, 2))


def test_official_state_dict_loads_strictly_and_save_load_round_trips(tmp_path):
    model = tiny_mar()
    overrides = {k: v for k, v in TINY.items()}
    loaded = MARModel.from_official_state_dict(model.state_dict(), "mar_base", **overrides)
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    bad = dict(model.state_dict())
    bad["extra.weight"] = bad.pop("fake_latent")
    with pytest.raises(ValueError, match=r"the state dict lacks 1 weight\(s\) of this MARModel: fake_latent"):
        MARModel.from_official_state_dict(bad, "mar_base", **overrides)
    with pytest.raises(ValueError, match="name must be one of"):
        MARModel.preset("mar_tiny")
    model.save_pretrained(tmp_path)
    again = MARModel.from_pretrained(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_mar_head_conditions_each_row_and_guides_eps_only():
    from mmspec.continuous.diffusion import DiffusionSchedule, sample_trajectory
    from mmspec.models.mar import MARHead
    from tests.continuous.toy import keyed_trajectory_noise

    model = tiny_mar()
    n = 6
    z, z_uncond = torch.randn(n, 32), torch.randn(n, 32)
    head = MARHead(model, z, z_uncond, guidance_scale=3.0)
    x, t, rows = torch.randn(4, 4), torch.tensor([5, 50, 500, 900]), torch.tensor([5, 0, 2, 2])
    eps, v = head(x, t, rows)
    cond, uncond = model.head(x, t, z[rows]), model.head(x, t, z_uncond[rows])
    assert torch.allclose(eps, uncond[:, :4] + 3.0 * (cond[:, :4] - uncond[:, :4]), atol=1e-5)
    assert torch.allclose(v, cond[:, 4:], atol=1e-6)
    # a subset of rows samples exactly what the full batch samples for them (the residual path relies on it)
    schedule = DiffusionSchedule.cosine(10)
    x_T, noise = keyed_trajectory_noise(0, torch.arange(n), 10, 4)
    full = sample_trajectory(head, schedule, x_T, noise)
    subset = torch.tensor([4, 1])
    part = sample_trajectory(head, schedule, x_T[subset], noise[:, subset], rows=subset)
    # relative: these random weights throw the chains to 1e5, where another batch size's float32 rounding shows
    assert torch.allclose(part.x, full.x[:, subset], rtol=1e-4, atol=1e-4)
    crossed = sample_trajectory(head, schedule, x_T[subset], noise[:, subset], rows=subset.flip(0))
    assert not torch.allclose(crossed.x, full.x[:, subset], rtol=1e-4, atol=1e-4)  # each row's own condition


def test_official_checkpoint_file_loads_its_ema_weights(tmp_path):
    import argparse

    model, ema = tiny_mar(0), tiny_mar(1)
    torch.save({"model": model.state_dict(), "model_ema": ema.state_dict(), "epoch": 3,
                "args": argparse.Namespace(model="mar_base")}, tmp_path / "checkpoint-last.pth")
    loaded = MARModel.from_mar_checkpoint(tmp_path / "checkpoint-last.pth", "mar_base", **TINY)
    assert all(torch.equal(a, b) for a, b in zip(ema.state_dict().values(), loaded.state_dict().values()))
    raw = MARModel.from_mar_checkpoint(tmp_path / "checkpoint-last.pth", "mar_base", weights="model", **TINY)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), raw.state_dict().values()))
    with pytest.raises(ValueError, match="is not a file"):
        MARModel.from_mar_checkpoint(tmp_path / "missing.pth", "mar_base")
