import logging

import pytest
import torch

from mmspec.models.mar import KLAutoencoder


def test_kl16_layout_uses_the_official_parameter_names():
    with torch.device("meta"):
        names = set(KLAutoencoder().state_dict())
    official = {
        "encoder.conv_in.weight",
        "encoder.down.0.block.1.conv2.weight",
        "encoder.down.2.block.0.nin_shortcut.weight",
        "encoder.down.3.downsample.conv.weight",
        "encoder.down.4.attn.1.proj_out.weight",
        "encoder.mid.block_1.norm1.weight",
        "encoder.mid.attn_1.q.weight",
        "encoder.mid.block_2.conv2.bias",
        "encoder.norm_out.weight",
        "encoder.conv_out.weight",
        "decoder.conv_in.weight",
        "decoder.mid.attn_1.v.bias",
        "decoder.up.0.block.2.conv1.weight",
        "decoder.up.3.block.0.nin_shortcut.weight",
        "decoder.up.4.upsample.conv.weight",
        "decoder.norm_out.bias",
        "decoder.conv_out.weight",
        "quant_conv.weight",
        "post_quant_conv.bias",
    }
    assert official <= names
    assert not any(".attn." in n and n.startswith("decoder.up") for n in names)  # attention in the encoder only
    assert "encoder.down.4.downsample.conv.weight" not in names and "decoder.up.0.upsample.conv.weight" not in names


def test_tiny_autoencoder_round_trips_shapes_and_weights(tmp_path):
    torch.manual_seed(0)
    vae = KLAutoencoder(embed_dim=4, ch=32, ch_mult=(1, 2, 2), num_res_blocks=1, encoder_attn_resolutions=(8,),
                        resolution=32).eval()
    images = torch.rand(2, 3, 32, 32) * 2 - 1
    mean, logvar = vae.encode(images)
    assert mean.shape == logvar.shape == (2, 4, 8, 8) and vae.downsample_factor == 4
    assert logvar.min() >= -30 and logvar.max() <= 20
    assert vae.decode(mean).shape == (2, 3, 32, 32)
    vae.save_pretrained(tmp_path)
    again = KLAutoencoder.from_pretrained(tmp_path).eval()
    assert torch.equal(again.decode(mean), vae.decode(mean))


def test_official_kl16_file_loads_with_its_loss_entries_and_refuses_what_is_not_there(tmp_path, caplog):
    """As LDM saves kl16.ckpt: the training loss's entries beside the weights are ignored and logged; a missing
    weight, an undeclared entry or another configuration is refused by name."""
    config = dict(embed_dim=4, ch=32, ch_mult=(1, 2), num_res_blocks=1, encoder_attn_resolutions=(16,), resolution=32)
    torch.manual_seed(1)
    vae = KLAutoencoder(**config)
    loss = {"loss.logvar": torch.zeros(()), "loss.discriminator.main.0.weight": torch.ones(2, 3)}
    torch.save({"model": {**vae.state_dict(), **loss}, "epoch": 7}, tmp_path / "kl16.ckpt")
    with caplog.at_level(logging.INFO, logger="mmspec.models.checkpoint"):
        loaded = KLAutoencoder.from_mar_checkpoint(tmp_path / "kl16.ckpt", **config)
    assert all(torch.equal(a, b) for a, b in zip(vae.state_dict().values(), loaded.state_dict().values()))
    assert "ignored 2 entries that are not KLAutoencoder weights: loss.discriminator.main.0.weight, loss.logvar" \
        in caplog.text
    with pytest.raises(ValueError, match=r"lacks 28 weight\(s\) of this KLAutoencoder: decoder\.up\.2\."):
        KLAutoencoder.from_mar_checkpoint(tmp_path / "kl16.ckpt", **{**config, "ch_mult": (1, 2, 2)})
    with pytest.raises(ValueError, match="is not a KL autoencoder of this configuration"):
        KLAutoencoder.from_mar_checkpoint(tmp_path / "kl16.ckpt", **{**config, "ch": 64})
    state = vae.state_dict()
    torch.save({"model": {k: v for k, v in state.items() if k != "post_quant_conv.bias"}}, tmp_path / "cut.ckpt")
    with pytest.raises(ValueError, match=r"cut.ckpt lacks 1 weight\(s\) of this KLAutoencoder: post_quant_conv.bias"):
        KLAutoencoder.from_mar_checkpoint(tmp_path / "cut.ckpt", **config)
    torch.save({"model": {**state, "lpips.net.weight": torch.ones(1)}}, tmp_path / "other.ckpt")
    with pytest.raises(ValueError, match="other.ckpt has 1 entry this KLAutoencoder does not have: lpips.net.weight"):
        KLAutoencoder.from_mar_checkpoint(tmp_path / "other.ckpt", **config)
