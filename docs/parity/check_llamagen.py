"""Parity of mmspec's LlamaGen t2i with FoundationVision/LlamaGen's own code (tiny random configs, CPU, float32).

Upstream builds and saves the GPT and VQ as its training scripts do; its T5Embedder cleans and encodes the prompts,
sample_t2i's left-padding is applied, and generate() runs. Ours loads the files and runs the same prompts through
LlamaGenPipeline (AR and SJD). Writes the results as JSON.

    python docs/parity/check_llamagen.py --upstream path/to/LlamaGen --deps path/to/deps --work /tmp/llamagen-parity \
        --json eval/results/parity_llamagen.json

--upstream: a checkout of FoundationVision/LlamaGen (its commit is recorded); --deps: a folder with beautifulsoup4
and ftfy (`pip install --target`), which its T5 embedder imports.
"""
import argparse

from common import arguments, upstream_commit, write

args = arguments()
import autoregressive.models.generate as up_generate
import torch
from autoregressive.models.gpt import ModelArgs, Transformer
from language.t5 import T5Embedder
from tokenizer.tokenizer_image.vq_model import ModelArgs as VQArgs
from tokenizer.tokenizer_image.vq_model import VQModel

from mmspec import AR, SJD
from mmspec.models.llamagen.gpt import LlamaGenTransformer
from mmspec.models.llamagen.vq import LlamaGenVQModel
from mmspec.pipelines.llamagen import LlamaGenPipeline
from tests.models.llamagen_tiny import WORDS, tiny_tokenizer

torch.set_grad_enabled(False)
T, GRID, V, CAPTION = 120, 4, 64, 16
out_dir = args.work

# ---- upstream models, random weights (upstream zeroes its output layer), saved as its training scripts save ----
torch.manual_seed(0)
gpt = Transformer(ModelArgs(dim=64, n_layer=2, n_head=4, vocab_size=V, cls_token_num=T, caption_dim=CAPTION,
                            block_size=GRID * GRID, model_type="t2i", token_dropout_p=0, resid_dropout_p=0,
                            ffn_dropout_p=0, class_dropout_prob=0.1)).eval()
for p in gpt.parameters():
    torch.nn.init.normal_(p, std=0.3)
gpt.cls_embedding.uncond_embedding.normal_(std=1.0)
torch.save({"model": gpt.state_dict(), "optimizer": {}, "steps": 1, "args": argparse.Namespace(gpt_model="tiny")},
           f"{out_dir}/t2i_tiny_64.pt")
vq = VQModel(VQArgs(codebook_size=V, codebook_embed_dim=8, encoder_ch_mult=[1, 1], decoder_ch_mult=[1, 1],
                    z_channels=32)).eval()
for p in vq.parameters():
    torch.nn.init.normal_(p, std=0.1)
torch.save({"model": vq.state_dict()}, f"{out_dir}/vq_ds16_t2i.pt")

# ---- the text encoder: a tiny random T5 with a word-level tokenizer, used by both sides ----
from transformers import T5Config, T5EncoderModel

torch.manual_seed(1)
t5 = T5EncoderModel(T5Config(vocab_size=len(WORDS), d_model=CAPTION, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                             dropout_rate=0.0)).eval()
tokenizer = tiny_tokenizer()
embedder = T5Embedder.__new__(T5Embedder)
embedder.device, embedder.use_text_preprocessing, embedder.model_max_length = torch.device("cpu"), True, T
embedder.tokenizer, embedder.model = tokenizer, t5

PROMPTS = ["a red circle", "A BLUE square on the left", "the green circle on the left on a red square",
           "a red circle on the left on the blue square on the green square",
           " ".join(["a red circle on the left"] * 22)]  # 3, 6, 10, 14 and 132 words (cut to the 120 slots)


def upstream_condition(prompts):
    """sample_t2i.py: T5Embedder's embeddings, then its left-padding and the zeroing of padded slots."""
    caption_embs, emb_masks = embedder.get_text_embeddings(prompts)
    new_masks = torch.flip(emb_masks, dims=[-1])
    new_embs = []
    for emb, mask in zip(caption_embs, emb_masks):
        valid = int(mask.sum().item())
        new_embs.append(torch.cat([emb[valid:], emb[:valid]]))
    new_embs = torch.stack(new_embs)
    return new_embs * new_masks[:, :, None], new_masks


recorded = []
original_sample = up_generate.sample


def recording_sample(logits, **kwargs):
    recorded.append(logits[:, -1].clone())
    return original_sample(logits, **kwargs)


up_generate.sample = recording_sample


def upstream_generate(prompts, cfg, cfg_interval=-1):
    recorded.clear()
    c_indices, masks = upstream_condition(prompts)
    tokens = up_generate.generate(gpt, c_indices, GRID * GRID, masks, cfg_scale=cfg, cfg_interval=cfg_interval,
                                  temperature=1.0, top_k=0, top_p=1.0, sample_logits=False)
    return tokens.long(), torch.stack(recorded, 1)  # [B, N], guided logits [B, N, V]


# ---- ours, from the files as saved ----
ours_gpt = LlamaGenTransformer.from_llamagen_checkpoint(f"{out_dir}/t2i_tiny_64.pt", image_size=GRID * 16,
                                                       n_head=4)
ours_vq = LlamaGenVQModel.from_llamagen_checkpoint(f"{out_dir}/vq_ds16_t2i.pt", ch=128, ch_mult=(1, 1),
                                                   z_channels=32)
pipe = LlamaGenPipeline(ours_gpt, ours_vq, tokenizer, t5)
pipe.set_progress_bar_config(disable=True)
adapter = pipe.image_adapter()


def ours_guided_logits(prompts, tokens, cfg, cfg_interval=-1):
    """Teacher-forced on upstream's tokens: the guided logits of every image token, as the decoders combine them."""
    condition = pipe.encode_prompt(prompts)
    state, first = adapter.prefill(condition, cfg=cfg != 1.0)
    rest = adapter.forward(tokens[:, :-1], state)
    cond = torch.cat([first.cond, rest.cond], 1)
    if cfg == 1.0:
        return cond
    uncond = torch.cat([first.uncond, rest.uncond], 1)
    if cfg_interval >= 0:
        late = torch.arange(tokens.shape[1]) > cfg_interval + 1
        uncond = torch.where(late[None, :, None], cond, uncond)
    return uncond + (cond - uncond) * cfg


results = {"upstream": "FoundationVision/LlamaGen", "commit": upstream_commit(args),
           "prompt_words": [len(p.split()) for p in PROMPTS], "text_slots": T, "rows": []}
for cfg in (1.0, 4.0, 7.5):
    for cfg_interval in ((-1, 3) if cfg != 1.0 else (-1,)):
        up_tokens, up_logits = upstream_generate(PROMPTS, cfg, cfg_interval)
        logits = ours_guided_logits(PROMPTS, up_tokens, cfg, cfg_interval)
        call = dict(guidance_scale=cfg, cfg_interval=cfg_interval, temperature=0.0, output_type="latent")
        ar = pipe(PROMPTS, decoding=AR(), **call).images
        sjd = pipe(PROMPTS, decoding=SJD(window=6), **call).images
        results["rows"].append({
            "guidance": cfg, "cfg_interval": cfg_interval,
            "guided_logits_max_abs_diff": float((logits - up_logits).abs().max()),
            "logit_scale": float(up_logits.abs().max()),
            "greedy_ar_equal": float((ar == up_tokens).float().mean()),
            "greedy_sjd_equal": float((sjd == up_tokens).float().mean()),
        })

# the convention mmspec had before (the null caption seeing every slot): what the fix changed
ours_gpt.register_to_config(null_caption_mask="all")
up_tokens, up_logits = upstream_generate(PROMPTS, 7.5)
before = ours_guided_logits(PROMPTS, up_tokens, 7.5)
ar = pipe(PROMPTS, decoding=AR(), guidance_scale=7.5, temperature=0.0, output_type="latent").images
results["before_fix_guidance_7.5"] = {"guided_logits_max_abs_diff": float((before - up_logits).abs().max()),
                                      "greedy_ar_equal": float((ar == up_tokens).float().mean())}
ours_gpt.register_to_config(null_caption_mask="prompt")

# the VQ decoder on the same codes
codes = torch.randint(0, V, (2, GRID * GRID))
up_pixels = vq.decode_code(codes, [2, 8, GRID, GRID])
ours_pixels = ours_vq.decode(codes, (GRID, GRID))
results["vq_decoder_max_abs_diff"] = float((up_pixels - ours_pixels).abs().max())
write(results, args)
