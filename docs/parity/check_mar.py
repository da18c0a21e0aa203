"""Parity of mmspec's MAR sampling with LTH14/mar's own `sample_tokens` (tiny random config, CPU, float32).

Upstream's model is built from its own source (timm's ViT blocks; torchvision stubbed, it is only imported), saved as
its training script saves (`model` + `model_ema`), loaded by ours. Both sample with the same generation orders and the
same diffusion noise: upstream's `torch.randn` / `randn_like` calls are fed the noise mmspec keys by (sample, position,
diffusion step). Compared at every MAR step: the guidance scale and the tokens drawn. Writes the results as JSON.

    python docs/parity/check_mar.py --upstream path/to/mar --deps path/to/deps --work /tmp/mar-parity \
        --json eval/results/parity_mar.json

--upstream: a checkout of LTH14/mar (its commit is recorded); --deps: a folder with timm (`pip install --target
--no-deps timm`), whose ViT block MAR uses.
"""
import argparse
from functools import partial

from common import arguments, upstream_commit, write

args = arguments()
import stub_torchvision  # noqa: F401  (before timm)
import torch
from models.mar import MAR
from torch import nn

from mmspec.continuous.diffusion import DiffusionSchedule
from mmspec.continuous.mar_decoding import _noise, cosine_plan, sample_orders
from mmspec.continuous.methods import AR
from mmspec.models.mar import MARModel

torch.set_grad_enabled(False)
torch.Tensor.cuda = lambda self, *args, **kwargs: self  # upstream's sampler moves everything to CUDA
out_dir = args.work
L, C, S = 16, 4, 10

torch.manual_seed(0)
up = MAR(img_size=64, vae_stride=16, patch_size=1, encoder_embed_dim=32, encoder_depth=2, encoder_num_heads=4,
         decoder_embed_dim=32, decoder_depth=2, decoder_num_heads=4, mlp_ratio=4.0,
         norm_layer=partial(nn.LayerNorm, eps=1e-6), vae_embed_dim=C, class_num=10, attn_dropout=0.0,
         proj_dropout=0.0, buffer_size=4, diffloss_d=2, diffloss_w=48, num_sampling_steps=str(S)).eval()
raw = {k: torch.randn_like(v) * 0.05 for k, v in up.state_dict().items()}
ema = {k: torch.randn_like(v) * 0.05 for k, v in up.state_dict().items()}
torch.save({"model": raw, "model_ema": ema, "optimizer": {}, "epoch": 1, "scaler": {},
            "args": argparse.Namespace(model="mar_tiny")}, f"{out_dir}/checkpoint-last.pth")
up.load_state_dict(ema)  # MAR's demo and evaluation sample with the EMA weights
ours = MARModel.from_mar_checkpoint(f"{out_dir}/checkpoint-last.pth", encoder_num_heads=4,
                                    decoder_num_heads=4).eval()

seeds, labels = torch.tensor([11, 12]), torch.tensor([3, 7])
schedule = DiffusionSchedule.cosine(S)


def upstream_run(num_iter, cfg, temperature=1.0):
    """sample_tokens with mmspec's orders and keyed noise; returns (scale per step, tokens drawn per step, final)."""
    orders = sample_orders(seeds, L)
    # upstream keeps the first mask_len positions of its order unknown (mask_by_order), so it predicts its order from
    # the end: mmspec's order reversed is the same generation order
    up.sample_orders = lambda bsz: orders.flip(1)
    plan, scales, drawn = cosine_plan(L, num_iter), [], []
    original_sample, original_randn, original_randn_like = up.diffloss.sample, torch.randn, torch.randn_like
    done = 0

    def sample(z, temperature, cfg_iter):
        nonlocal done
        count = plan[len(scales)]
        positions = orders[:, done:done + count].sort(dim=1).values  # upstream's nonzero() order: row, position
        done += count
        x_T, noise = _noise(seeds.repeat_interleave(count), positions.reshape(-1), schedule, C)
        calls = iter(range(S - 1, -1, -1))
        torch.randn = lambda *shape, **kw: x_T.clone()
        torch.randn_like = lambda x, **kw: noise[next(calls)].repeat(x.shape[0] // noise.shape[1], 1)
        try:
            result = original_sample(z, temperature, cfg_iter)
        finally:
            torch.randn, torch.randn_like = original_randn, original_randn_like
        scales.append(float(cfg_iter))
        drawn.append((positions, result[: positions.numel()].view(2, count, C)))
        return result

    up.diffloss.sample = sample
    try:
        final = up.sample_tokens(2, num_iter=num_iter, cfg=cfg, cfg_schedule="linear", labels=labels,
                                 temperature=temperature)
    finally:
        up.diffloss.sample = original_sample
    return scales, drawn, final


def ours_run(num_iter, cfg, temperature=1.0):
    scales, states = [], []

    class Recording(AR):
        def steps(self, *args):
            inner = super().steps(*args)

            def step(state, index, positions, scale, last):
                scales.append(scale)
                return inner(state, index, positions, scale, last)
            return step

    def on_step(step, known, tensors):
        states.append(tensors["latents"].clone())

    tokens, _ = Recording().run(ours, None, seeds, num_iter, schedule, labels, cfg, temperature, on_step)
    return scales, states, tokens


results = {"upstream": "LTH14/mar", "commit": upstream_commit(args), "seq_len": L, "diffusion_steps": S, "runs": []}
for num_iter, cfg in ((16, 3.0), (6, 3.0), (4, 1.0)):
    up_scales, up_drawn, up_final = upstream_run(num_iter, cfg)
    our_scales, our_states, our_tokens = ours_run(num_iter, cfg)
    token_diffs = []
    for (positions, values), state in zip(up_drawn, our_states, strict=True):
        ours_at = state.gather(1, positions[..., None].expand(-1, -1, C))  # [2, n, C]
        token_diffs.append(float((ours_at - values).abs().max()))
    final = our_tokens.transpose(1, 2).reshape(2, C, 4, 4)
    results["runs"].append({
        "num_iter": num_iter, "guidance": cfg,
        "scale_max_abs_diff": max(abs(a - b) for a, b in zip(up_scales, our_scales, strict=True)),
        "last_step_scale": {"upstream": up_scales[-1], "ours": our_scales[-1]},
        "step_tokens_max_abs_diff": max(token_diffs), "steps": len(token_diffs),
        "final_tokens_max_abs_diff": float((final - up_final).abs().max()),
        "token_scale": float(up_final.abs().max()),
    })
write(results, args)
