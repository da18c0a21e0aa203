"""Train the embedded text pair (target + draft `LlamaForCausalLM`) on the Python standard library, offline, on CPU.

    python -m mmspec.zoo.train_text --work-dir ~/.cache/mmspec/train_text            # both models, default budget
    python -m mmspec.zoo.train_text --only draft --draft-steps 200                    # resume / extend one model

Steps: (1) train a byte-level BPE tokenizer on the train split, (2) tokenize both splits once (cached in the work dir),
(3) train the target with an early-exit loss (LayerSkip, arXiv 2404.16710: the shared head also reads the hidden state
after layer `exit_layer`, so the self-speculative layer-skip drafter has a usable exit), (4) train the draft, (5) save
both in transformers format with fp16 safetensors and a `training_metrics.json` with held-out perplexities.

Training checkpoints (model, optimiser, step, RNG) are written every `--ckpt-every` steps; re-running resumes.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from mmspec.zoo import ZOO_DIR
from mmspec.zoo.text_corpus import corpus_files, read_texts

logger = logging.getLogger(__name__)

VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>"]


@dataclass(frozen=True)
class TextModelSpec:
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    exit_layer: int | None = None  # early-exit loss after this many layers (LayerSkip); None = no exit loss
    exit_loss_weight: float = 0.25


# Deep and thin (MobileLLM, arXiv 2402.14905): at this size depth buys more quality per parameter than width.
TARGET_SPEC = TextModelSpec(hidden_size=192, num_hidden_layers=12, intermediate_size=512, num_attention_heads=6, exit_layer=3)
DRAFT_SPEC = TextModelSpec(hidden_size=128, num_hidden_layers=2, intermediate_size=384, num_attention_heads=4)


def train_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=SPECIAL_TOKENS[0], bos_token=SPECIAL_TOKENS[0], pad_token=SPECIAL_TOKENS[1]
    )


def tokenize_corpus(tokenizer, texts: list[str]) -> np.ndarray:
    """All documents as one uint16 stream, each followed by the end-of-text token."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for encoded in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(encoded)
        ids.append(eos)
    return np.asarray(ids, dtype=np.uint16)


def build_model(spec: TextModelSpec, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_attention_heads,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config)


def sample_windows(stream: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, stream.numel() - seq_len - 1, (batch_size,), generator=generator)
    offsets = torch.arange(seq_len + 1)
    return stream[starts[:, None] + offsets].long()  # [B, seq_len + 1]


def lm_losses(model, tokens: torch.Tensor, exit_layer: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Next-token cross-entropy of the final head and, if `exit_layer` is set, of the early exit through the same head."""
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    out = model.model(input_ids=inputs, output_hidden_states=exit_layer is not None)
    logits = model.lm_head(out.last_hidden_state)
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    if exit_layer is None:
        return loss, None
    exit_logits = model.lm_head(model.model.norm(out.hidden_states[exit_layer]))
    return loss, F.cross_entropy(exit_logits.flatten(0, 1), labels.flatten())


@torch.no_grad()
def held_out_losses(model, stream: torch.Tensor, exit_layer: int | None, seq_len: int, max_windows: int = 256) -> dict:
    """Mean held-out loss over non-overlapping windows (deterministic)."""
    model.eval()
    n = min(max_windows, (stream.numel() - 1) // (seq_len + 1))
    windows = stream[: n * (seq_len + 1)].view(n, seq_len + 1).long()
    totals = {"loss": 0.0, "exit_loss": 0.0}
    for chunk in windows.split(32):
        loss, exit_loss = lm_losses(model, chunk, exit_layer)
        totals["loss"] += loss.item() * len(chunk)
        if exit_loss is not None:
            totals["exit_loss"] += exit_loss.item() * len(chunk)
    model.train()
    result = {"held_out_loss": totals["loss"] / n, "held_out_ppl": math.exp(totals["loss"] / n)}
    if exit_layer is not None:
        result.update(exit_held_out_loss=totals["exit_loss"] / n, exit_held_out_ppl=math.exp(totals["exit_loss"] / n))
    return result


def train_model(name: str, spec: TextModelSpec, tokenizer, train: torch.Tensor, held_out: torch.Tensor, args) -> dict:
    torch.manual_seed(args.seed)
    model = build_model(spec, tokenizer)
    steps = args.target_steps if name == "target" else args.draft_steps
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = min(100, steps // 10)

    def lr_at(step: int) -> float:
        if step < warmup:
            return args.lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    generator = torch.Generator().manual_seed(args.seed + (0 if name == "target" else 1))
    ckpt_path = Path(args.work_dir) / f"ckpt-{name}.pt"
    start, elapsed = 0, 0.0
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        generator.set_state(ckpt["generator"])
        start, elapsed = ckpt["step"], ckpt["elapsed_s"]
        logger.info("resuming %s from step %d", name, start)

    model.train()
    t0 = time.perf_counter()
    bar = tqdm(range(start, steps), desc=f"train {name}", initial=start, total=steps)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        tokens = sample_windows(train, args.batch_size, args.seq_len, generator)
        loss, exit_loss = lm_losses(model, tokens, spec.exit_layer)
        total = loss if exit_loss is None else loss + spec.exit_loss_weight * exit_loss
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
        done = step + 1
        if done % args.ckpt_every == 0 or done == steps:
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "generator": generator.get_state(),
                "step": done,
                "elapsed_s": elapsed + time.perf_counter() - t0,
            }
            torch.save(state, ckpt_path)
    elapsed += time.perf_counter() - t0

    metrics = held_out_losses(model, held_out, spec.exit_layer, args.seq_len)
    metrics.update(
        parameters=sum(p.numel() for p in model.parameters()),
        steps=steps,
        tokens_seen=steps * args.batch_size * args.seq_len,
        train_cpu_seconds=round(elapsed, 1),
        spec=asdict(spec),
    )
    out_dir = Path(args.out_dir) / name
    model.config.dtype = "float16"
    if spec.exit_layer is not None:
        model.config.early_exit_layer = spec.exit_layer  # read by LayerSkipDrafter users (`mmspec text --method layerskip`)
    model.to(torch.float16).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "training_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    logger.info("%s: %s", name, metrics)
    return metrics


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", default=str(Path.home() / ".cache" / "mmspec" / "train_text"))
    parser.add_argument("--out-dir", default=str(ZOO_DIR / "pycode"))
    parser.add_argument("--only", choices=["target", "draft"], default=None)
    parser.add_argument("--target-steps", type=int, default=1800)
    parser.add_argument("--draft-steps", type=int, default=1800)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--ckpt-every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus-root", default=None, help="train on .py files under this folder (default: the stdlib)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    root = None if args.corpus_root is None else Path(args.corpus_root)
    tokenizer_dir = work / "tokenizer"
    if tokenizer_dir.exists():
        from transformers import PreTrainedTokenizerFast

        tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    else:
        tokenizer = train_tokenizer(read_texts(corpus_files("train", root)))
        tokenizer.save_pretrained(tokenizer_dir)
    streams = {}
    for split in ("train", "held_out"):
        cache = work / f"{split}.npy"
        if not cache.exists():
            np.save(cache, tokenize_corpus(tokenizer, read_texts(corpus_files(split, root))))
        streams[split] = torch.from_numpy(np.load(cache).astype(np.int32))
        logger.info("%s split: %d tokens", split, streams[split].numel())

    for name, spec in (("target", TARGET_SPEC), ("draft", DRAFT_SPEC)):
        if args.only in (None, name):
            train_model(name, spec, tokenizer, streams["train"], streams["held_out"], args)


if __name__ == "__main__":
    main()
