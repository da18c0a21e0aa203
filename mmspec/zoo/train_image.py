"""Train the embedded text-to-image model (LlamaGen VQ tokenizer + LlamaGen GPT + a small T5 text encoder) on the
synthetic captioned scenes of `mmspec.zoo.shapes`, offline, on the CPU or a GPU.

    python -m mmspec.zoo.train_image                      # all stages, default budget, writes mmspec/zoo/shapes
    python -m mmspec.zoo.train_image --only vq            # one stage; re-running resumes from its checkpoint

Stages: (1) render the scene pools once (cached in the work dir), (2) `vq`: train the VQ tokenizer (MSE + codebook /
commitment loss, dead codes re-seeded from the batch), (3) `tokenize`: encode every scene to 16x16 code ids,
(4) `ar`: train the text encoder and the GPT jointly on (caption, ids) with 10% caption dropout for classifier-free
guidance, (5) save the pipeline (fp16 safetensors) with `training_metrics.json`, (6) `draft`: distil a small draft
GPT (same VQ codes and text states) from the saved GPT, for draft-model speculative decoding; saved as the pipeline's
`draft_transformer`.

    python -m mmspec.zoo.train_image --only draft         # after the pipeline exists in --out-dir

The shipped model was retrained on one GPU from the shipped VQ tokenizer (about 8 minutes on an H100):

    python -m mmspec.zoo.train_image --device cuda --vq-from mmspec/zoo/shapes --train-scenes 300000 \
        --ar-steps 8000 --ar-batch-size 128 --draft-steps 3000 --draft-batch-size 128 --ckpt-every 1000
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from concurrent.futures import ProcessPoolExecutor
from itertools import repeat
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mmspec.core.runtime.devices import add_device_arguments, resolve_device
from mmspec.models.llamagen.gpt import LlamaGenTransformer
from mmspec.models.llamagen.vq import LlamaGenVQModel
from mmspec.zoo import ZOO_DIR
from mmspec.zoo.pixels import psnr, reconstruct, to_model_range
from mmspec.zoo.shapes import CAPTION_WORDS, scenes
from mmspec.zoo.training import (
    add_stage_arguments,
    copy_stage,
    index_entry,
    save_stage,
    seconds_key,
    total_variation,
    train_loop,
)

logger = logging.getLogger(__name__)

IMAGE_SIZE = 64
VQ_CONFIG = {"codebook_size": 1024, "codebook_embed_dim": 8, "ch": 32, "ch_mult": (1, 1, 2), "num_res_blocks": 1,
             "z_channels": 64}
TEXT_CONTEXT = 16  # caption tokens (words); the longest caption has 14
TEXT_ENCODER_CONFIG = {"d_model": 128, "d_kv": 32, "d_ff": 256, "num_layers": 2, "num_heads": 4,
                       "relative_attention_num_buckets": 16, "relative_attention_max_distance": 32, "dropout_rate": 0.0}
TRANSFORMER_CONFIG = {"vocab_size": 1024, "dim": 256, "n_layer": 6, "n_head": 8, "model_type": "t2i",
                      "caption_dim": 128, "cls_token_num": TEXT_CONTEXT, "grid_size": 16, "class_dropout_prob": 0.1,
                      "token_dropout_p": 0.0, "resid_dropout_p": 0.0, "ffn_dropout_p": 0.0,
                      # the shipped model's null caption sees all 16 slots (LlamaGen's own: the prompt's mask)
                      "null_caption_mask": "all"}
DRAFT_CONFIG = {**TRANSFORMER_CONFIG, "dim": 192, "n_layer": 2, "n_head": 6}
STAGE_SEEDS = {"vq": 10, "ar": 20, "draft": 30}
RENDER_CHUNK = 5000  # scenes per rendering process


def load_pool(work: Path, split: str, n: int) -> tuple[torch.Tensor, list[str]]:
    """Scenes 0..n-1 of `split` as (uint8 images [n, 64, 64, 3], captions), rendered once and cached."""
    images_path, captions_path = work / f"{split}-{n}.npy", work / f"{split}-{n}.json"
    if not images_path.exists():
        starts = range(0, n, RENDER_CHUNK)
        with ProcessPoolExecutor() as pool:
            chunks = list(pool.map(scenes, starts, [min(start + RENDER_CHUNK, n) for start in starts], repeat(split),
                                   repeat(IMAGE_SIZE)))
        images, captions = np.concatenate([c[0] for c in chunks]), [caption for c in chunks for caption in c[1]]
        np.save(images_path, images)
        captions_path.write_text(json.dumps(captions))
    return torch.from_numpy(np.load(images_path)), json.loads(captions_path.read_text())


def add_pool_arguments(parser: argparse.ArgumentParser) -> None:
    """--work-dir, --train-scenes, --held-out-scenes: the cached scene pools the image-world trainers share."""
    parser.add_argument("--work-dir", default=str(Path.home() / ".cache" / "mmspec" / "train_image"))
    parser.add_argument("--train-scenes", type=int, default=30000)
    parser.add_argument("--held-out-scenes", type=int, default=1024)


def load_pools(args) -> tuple[Path, tuple[torch.Tensor, list[str]], tuple[torch.Tensor, list[str]]]:
    """(work dir, train pool, held-out pool) for the `add_pool_arguments` options; creates the work dir."""
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    return work, load_pool(work, "train", args.train_scenes), load_pool(work, "heldout", args.held_out_scenes)


class CodebookReviver:
    """Re-seeds codes unused for `every` steps with random encoder outputs of the latest batch (the dead-code restart
    of Jukebox / SoundStream), so that the small codebook is fully used. A training-time device only."""

    def __init__(self, model: LlamaGenVQModel, every: int = 50):
        self.model, self.every = model, every
        self.used = torch.zeros(model.config.codebook_size, dtype=torch.bool)
        self.latest: torch.Tensor | None = None  # [N, C] code-space vectors of the latest batch

    def observe(self, latents: torch.Tensor, ids: torch.Tensor) -> None:
        self.used = self.used.to(ids.device)
        self.used[ids.flatten()] = True
        self.latest = latents.detach().permute(0, 2, 3, 1).reshape(-1, latents.shape[1])

    def __call__(self, step: int) -> None:
        if (step + 1) % self.every:
            return
        dead = (~self.used).nonzero().squeeze(-1)
        if len(dead) and self.latest is not None:
            pick = torch.randint(0, len(self.latest), (len(dead),))
            with torch.no_grad():
                self.model.quantize.embedding.weight[dead] = F.normalize(self.latest[pick], dim=-1)
        self.used.zero_()


def reconstruction_metrics(vq: LlamaGenVQModel, images: torch.Tensor) -> dict:
    """Held-out PSNR (dB, on [0, 255] after clamping) and codebook usage."""
    ids, recon = reconstruct(vq, images)
    used = torch.zeros(vq.config.codebook_size, dtype=torch.bool)
    used[ids.flatten()] = True
    return {"held_out_psnr_db": round(psnr(recon, images).mean().item(), 2),
            "codebook_usage": round(used.float().mean().item(), 4)}


def train_vq(work: Path, pool: torch.Tensor, held_out: torch.Tensor, args) -> LlamaGenVQModel:
    torch.manual_seed(args.seed)
    vq = LlamaGenVQModel(**VQ_CONFIG)
    reviver = CodebookReviver(vq)

    def batch_fn(generator):
        return to_model_range(pool[torch.randint(0, len(pool), (args.vq_batch_size,), generator=generator)])

    def loss_fn(model, x):
        recon, vq_loss, ids = model(x)
        reviver.observe(model.encode_latents(x[:8]), ids[:8])
        mse = F.mse_loss(recon, x)
        return mse + vq_loss, mse

    seconds = train_loop("vq", vq, steps=args.vq_steps, lr=args.vq_lr, loss_fn=loss_fn, batch_fn=batch_fn,
                         work_dir=work, seed=args.seed + STAGE_SEEDS["vq"], ckpt_every=args.ckpt_every,
                         weight_decay=0.0, after_step=reviver)
    save_stage(vq, work / "vqvae", reconstruction_metrics(vq, held_out), args.vq_steps, args.vq_batch_size, seconds)
    return vq


@torch.no_grad()
def tokenize(vq: LlamaGenVQModel, images: torch.Tensor) -> torch.Tensor:
    """uint8 images [N, 64, 64, 3] -> int16 code ids [N, 256]."""
    vq.eval()
    device = next(vq.parameters()).device
    return torch.cat([vq.encode(to_model_range(chunk.to(device))).cpu() for chunk in images.split(256)]).to(torch.int16)


def build_tokenizer():
    """Word-level tokenizer over the caption grammar's words (+ [PAD], [UNK]); pads on the left, as LlamaGen lays out
    its text states."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {word: i for i, word in enumerate(["[PAD]", "[UNK]", *CAPTION_WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]", padding_side="left",
                                   model_max_length=TEXT_CONTEXT)


class TextToImageModel(torch.nn.Module):
    """Training wrapper: text encoder and GPT optimised jointly (LlamaGen freezes its T5; ours is trained from scratch
    on the captions)."""

    def __init__(self, text_encoder, transformer: LlamaGenTransformer):
        super().__init__()
        self.text_encoder, self.transformer = text_encoder, transformer

    def forward(self, input_ids, attention_mask, tokens, drop=None):
        states = self.text_encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.transformer(tokens, states, attention_mask.bool(), drop)


def encode_captions(tokenizer, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    encoded = tokenizer(captions, padding="max_length", max_length=TEXT_CONTEXT, return_tensors="pt")
    if (encoded.input_ids == tokenizer.unk_token_id).any():
        raise ValueError("a caption has a word outside CAPTION_WORDS")
    return encoded.input_ids, encoded.attention_mask


@torch.no_grad()
def held_out_loss(model: TextToImageModel, text: tuple, ids: torch.Tensor) -> float:
    model.eval()
    device = next(model.parameters()).device
    total = 0.0
    for start in range(0, len(ids), 64):
        input_ids, mask, tokens = (t[start:start + 64].to(device) for t in (*text, ids))
        logits = model(input_ids, mask, tokens)
        total += F.cross_entropy(logits.flatten(0, 1), tokens.flatten(), reduction="sum").item()
    return total / ids.numel()


def caption_batches(work: Path, tokenizer, captions: dict, batch_size: int, drop_prob: float):
    """(ids, text, batch_fn) of the tokenised scenes: ids {split: [n, 256] long}, text {split: (input_ids, mask)},
    and batch_fn(generator) -> (input_ids, mask, ids, drop) of `batch_size` random training scenes, `drop` marking
    the captions replaced by the unconditional one (probability drop_prob, for classifier-free guidance)."""
    ids = {split: torch.from_numpy(np.load(work / f"{split}-ids.npy")).long() for split in ("train", "heldout")}
    text = {split: encode_captions(tokenizer, captions[split]) for split in ("train", "heldout")}

    def batch_fn(generator):
        rows = torch.randint(0, len(ids["train"]), (batch_size,), generator=generator)
        drop = torch.rand(batch_size, generator=generator) < drop_prob
        return text["train"][0][rows], text["train"][1][rows], ids["train"][rows], drop

    return ids, text, batch_fn


def train_ar(work: Path, captions: dict, args) -> None:
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(args.seed)
    tokenizer = build_tokenizer()
    text_encoder = T5EncoderModel(T5Config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                           **TEXT_ENCODER_CONFIG))
    model = TextToImageModel(text_encoder, LlamaGenTransformer(**TRANSFORMER_CONFIG))
    ids, text, batch_fn = caption_batches(work, tokenizer, captions, args.ar_batch_size,
                                          model.transformer.config.class_dropout_prob)

    def loss_fn(model, batch):
        input_ids, mask, tokens, drop = batch
        loss = F.cross_entropy(model(input_ids, mask, tokens, drop).flatten(0, 1), tokens.flatten())
        return loss, loss

    seconds = train_loop("ar", model, steps=args.ar_steps, lr=args.ar_lr, loss_fn=loss_fn, batch_fn=batch_fn,
                         work_dir=work, seed=args.seed + STAGE_SEEDS["ar"], ckpt_every=args.ckpt_every,
                         device=args.device)
    loss = held_out_loss(model, text["heldout"], ids["heldout"])
    metrics = {
        "held_out_loss": round(loss, 4),
        "held_out_ppl": round(math.exp(loss), 2),
        "transformer_parameters": sum(p.numel() for p in model.transformer.parameters()),
        "text_encoder_parameters": sum(p.numel() for p in model.text_encoder.parameters()),
        "steps": args.ar_steps,
        "batch_size": args.ar_batch_size,
        "image_tokens_seen": args.ar_steps * args.ar_batch_size * model.transformer.num_image_tokens,
        seconds_key(args.device): round(seconds, 1),
    }
    logger.info("ar: %s", metrics)
    save_pipeline(Path(args.out_dir), work, model, tokenizer, metrics)


def save_pipeline(out: Path, work: Path, model: TextToImageModel, tokenizer, metrics: dict) -> None:
    """Write the `LlamaGenPipeline.from_pretrained` layout with fp16 weights. `model_index.json` is written here
    because the engine does not import `pipelines` (docs/architecture.md)."""
    import diffusers

    out.mkdir(parents=True, exist_ok=True)
    vq = LlamaGenVQModel.from_pretrained(work / "vqvae")
    vq.to(torch.float16).save_pretrained(out / "vqvae")
    model.transformer.to(torch.float16).save_pretrained(out / "transformer")
    model.text_encoder.to(torch.float16).save_pretrained(out / "text_encoder")
    # transformers loads with dtype="auto" by default: record float32 so a plain from_pretrained computes in float32,
    # as the diffusers components do (the file still holds fp16 weights).
    config_path = out / "text_encoder" / "config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "dtype": "float32"}, indent=2) + "\n")
    tokenizer.save_pretrained(out / "tokenizer")
    index = {
        "_class_name": "LlamaGenPipeline",
        "_diffusers_version": diffusers.__version__,
        "text_encoder": ["transformers", type(model.text_encoder).__name__],
        "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
        "transformer": index_entry(type(model.transformer)),
        "vqvae": index_entry(type(vq)),
    }
    (out / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    vq_metrics = json.loads((work / "vqvae" / "training_metrics.json").read_text())
    (out / "training_metrics.json").write_text(json.dumps({"vqvae": vq_metrics, "ar": metrics}, indent=2) + "\n")


def train_draft(work: Path, captions: dict, args) -> None:
    """Distil DRAFT_CONFIG from the saved GPT: soft cross-entropy to the target's next-token laws (temperature 1, with
    the same 10% caption dropout, so the draft also learns the unconditional rows that CFG needs), text encoder
    frozen. Writes `draft_transformer/` beside the pipeline and its metrics into `training_metrics.json`."""
    from transformers import T5EncoderModel

    out = Path(args.out_dir)
    torch.manual_seed(args.seed + STAGE_SEEDS["draft"])
    tokenizer = build_tokenizer()
    text_encoder = T5EncoderModel.from_pretrained(out / "text_encoder", dtype=torch.float32).to(args.device)
    text_encoder.eval().requires_grad_(False)
    target = LlamaGenTransformer.from_pretrained(out / "transformer").float().to(args.device)
    target.eval().requires_grad_(False)
    draft = LlamaGenTransformer(**DRAFT_CONFIG)
    ids, text, batch_fn = caption_batches(work, tokenizer, captions, args.draft_batch_size,
                                          draft.config.class_dropout_prob)

    def loss_fn(model, batch):
        input_ids, mask, tokens, drop = batch
        with torch.no_grad():
            states = text_encoder(input_ids=input_ids, attention_mask=mask).last_hidden_state
            teacher = target(tokens, states, mask.bool(), drop).softmax(-1)
        log_q = model(tokens, states, mask.bool(), drop).log_softmax(-1)
        soft_ce = -(teacher * log_q).sum(-1).mean()
        return soft_ce, soft_ce

    seconds = train_loop("draft", draft, steps=args.draft_steps, lr=args.draft_lr, loss_fn=loss_fn, batch_fn=batch_fn,
                         work_dir=work, seed=args.seed + STAGE_SEEDS["draft"], ckpt_every=args.ckpt_every,
                         device=args.device)
    metrics = {
        **draft_agreement(text_encoder, target, draft, text["heldout"], ids["heldout"]),
        "parameters": sum(p.numel() for p in draft.parameters()),
        "steps": args.draft_steps,
        "batch_size": args.draft_batch_size,
        seconds_key(args.device): round(seconds, 1),
    }
    logger.info("draft: %s", metrics)
    draft.to(torch.float16).save_pretrained(out / "draft_transformer")
    index_path = out / "model_index.json"
    index = {**json.loads(index_path.read_text()), "draft_transformer": index_entry(type(draft))}
    index_path.write_text(json.dumps(index, indent=2) + "\n")
    metrics_path = out / "training_metrics.json"
    metrics_path.write_text(json.dumps({**json.loads(metrics_path.read_text()), "draft": metrics}, indent=2) + "\n")


@torch.no_grad()
def draft_agreement(text_encoder, target, draft, text: tuple, ids: torch.Tensor) -> dict:
    """Teacher-forced on held-out scenes, CFG off: the draft's cross-entropy on the data and the exact rule's expected
    acceptance sum_v min(p, q) of a draft sample, averaged over positions."""
    device = next(draft.parameters()).device
    nll, acceptance = 0.0, 0.0
    for start in range(0, len(ids), 64):
        input_ids, mask, tokens = (t[start:start + 64].to(device) for t in (*text, ids))
        states = text_encoder(input_ids=input_ids, attention_mask=mask).last_hidden_state
        q_logits = draft(tokens, states, mask.bool())
        p = target(tokens, states, mask.bool()).softmax(-1)
        nll += F.cross_entropy(q_logits.flatten(0, 1), tokens.flatten(), reduction="sum").item()
        acceptance += (1 - total_variation(p, q_logits)).sum().item()
    return {"held_out_loss": round(nll / ids.numel(), 4), "held_out_acceptance": round(acceptance / ids.numel(), 4)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pool_arguments(parser)
    parser.add_argument("--out-dir", default=str(ZOO_DIR / "shapes"))
    parser.add_argument("--only", choices=["vq", "tokenize", "ar", "draft"], default=None)
    parser.add_argument("--vq-from", default=None, metavar="PIPELINE_DIR",
                        help="take this saved pipeline's VQ tokenizer (and its metrics) instead of training one, so "
                             "that a retrained GPT keeps the codes of the shipped model")
    add_device_arguments(parser, dtype=False)  # on CUDA the forwards run under bfloat16 autocast
    for stage, steps, batch_size, lr in (("vq", 1800, 32, 1e-3), ("ar", 1600, 32, 1.5e-3), ("draft", 1000, 24, 2e-3)):
        add_stage_arguments(parser, stage, steps, batch_size, lr)
    parser.add_argument("--ckpt-every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.device = resolve_device(parser, args.device)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    work, (pool, train_captions), (held_out, held_out_captions) = load_pools(args)
    if args.vq_from is not None:
        copy_stage(Path(args.vq_from), "vqvae", LlamaGenVQModel, "vqvae", work / "vqvae")
    elif args.only in (None, "vq"):
        train_vq(work, pool, held_out, args)
    if args.only in (None, "tokenize"):
        vq = LlamaGenVQModel.from_pretrained(work / "vqvae").to(args.device)
        for split, images in (("train", pool), ("heldout", held_out)):
            np.save(work / f"{split}-ids.npy", tokenize(vq, images).numpy())
            logger.info("tokenized %s: %d scenes", split, len(images))
    captions = {"train": train_captions, "heldout": held_out_captions}
    if args.only in (None, "ar"):
        train_ar(work, captions, args)
    if args.only in (None, "draft"):
        train_draft(work, captions, args)


if __name__ == "__main__":
    main()
