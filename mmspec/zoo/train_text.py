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
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mmspec.zoo import ZOO_DIR
from mmspec.zoo.text_corpus import corpus_files, read_texts
from mmspec.zoo.training import train_loop

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
TARGET_SPEC = TextModelSpec(hidden_size=192, num_hidden_layers=12, intermediate_size=512, num_attention_heads=6,
                            exit_layer=3)
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
        tokenizer_object=tokenizer, eos_token=SPECIAL_TOKENS[0], bos_token=SPECIAL_TOKENS[0],
        pad_token=SPECIAL_TOKENS[1]
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
    """Next-token cross-entropy of the final head and, if `exit_layer` is set, of the early exit through the same
    head."""
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


STAGE_SEED_OFFSETS = {"target": 0, "draft": 1, "draft-distill": 2}  # data-order seeds of the training stages


def distill_loss(student, teacher, tokens: torch.Tensor) -> torch.Tensor:
    """Forward KL to the teacher's next-token laws (soft cross-entropy; DistillSpec, arXiv 2310.08461): a draft closer
    to the target in distribution has a higher acceptance rate 1 - TV(p, q)."""
    inputs = tokens[:, :-1]
    with torch.no_grad():
        p = teacher(input_ids=inputs).logits.float().softmax(-1)
    log_q = student(input_ids=inputs).logits.float().log_softmax(-1)
    return -(p * log_q).sum(-1).mean()


def run_stage(name: str, model, steps: int, lr: float, loss_fn, train: torch.Tensor, args) -> float:
    """Train `model` on random windows of `train` (resumable, see `train_loop`). Returns seconds spent."""
    return train_loop(
        name, model, steps=steps, lr=lr, loss_fn=loss_fn,
        batch_fn=lambda generator: sample_windows(train, args.batch_size, args.seq_len, generator),
        work_dir=args.work_dir, seed=args.seed + STAGE_SEED_OFFSETS[name], ckpt_every=args.ckpt_every,
    )


def lm_loss_fn(spec: TextModelSpec):
    def loss_fn(model, tokens):
        loss, exit_loss = lm_losses(model, tokens, spec.exit_layer)
        return (loss if exit_loss is None else loss + spec.exit_loss_weight * exit_loss), loss
    return loss_fn


def distill_loss_fn(teacher):
    def loss_fn(model, tokens):
        loss = distill_loss(model, teacher, tokens)
        return loss, loss
    return loss_fn


def save_model(model, tokenizer, out_dir: Path, metrics: dict, exit_layer: int | None) -> None:
    model.config.dtype = "float16"
    if exit_layer is not None:
        model.config.early_exit_layer = exit_layer  # read by LayerSkipDrafter users (`mmspec text --method layerskip`)
    model.to(torch.float16).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "training_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    logger.info("%s: %s", out_dir.name, metrics)


def train_target(tokenizer, streams, args) -> None:
    torch.manual_seed(args.seed)
    model = build_model(TARGET_SPEC, tokenizer)
    seconds = run_stage("target", model, args.target_steps, args.lr, lm_loss_fn(TARGET_SPEC), streams["train"], args)
    metrics = held_out_losses(model, streams["held_out"], TARGET_SPEC.exit_layer, args.seq_len)
    metrics.update(parameters=sum(p.numel() for p in model.parameters()), steps=args.target_steps,
                   tokens_seen=args.target_steps * args.batch_size * args.seq_len, train_cpu_seconds=round(seconds, 1),
                   spec=asdict(TARGET_SPEC))
    save_model(model, tokenizer, Path(args.out_dir) / "target", metrics, TARGET_SPEC.exit_layer)


def train_draft(tokenizer, streams, args) -> None:
    """Stage 1: next-token cross-entropy on the corpus. Stage 2: distillation from the saved target."""
    torch.manual_seed(args.seed)
    model = build_model(DRAFT_SPEC, tokenizer)
    seconds = run_stage("draft", model, args.draft_steps, args.lr, lm_loss_fn(DRAFT_SPEC), streams["train"], args)
    metrics = {"pretrain": held_out_losses(model, streams["held_out"], None, args.seq_len)}
    if args.draft_distill_steps:
        from mmspec.zoo import load_causal_lm

        teacher, _ = load_causal_lm(Path(args.out_dir) / "target")
        seconds += run_stage("draft-distill", model, args.draft_distill_steps, args.lr / 2,
                             distill_loss_fn(teacher), streams["train"], args)
    metrics.update(held_out_losses(model, streams["held_out"], None, args.seq_len))
    steps = args.draft_steps + args.draft_distill_steps
    metrics.update(parameters=sum(p.numel() for p in model.parameters()), steps=args.draft_steps,
                   distill_steps=args.draft_distill_steps, tokens_seen=steps * args.batch_size * args.seq_len,
                   train_cpu_seconds=round(seconds, 1), spec=asdict(DRAFT_SPEC))
    save_model(model, tokenizer, Path(args.out_dir) / "draft", metrics, None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", default=str(Path.home() / ".cache" / "mmspec" / "train_text"))
    parser.add_argument("--out-dir", default=str(ZOO_DIR / "pycode"))
    parser.add_argument("--only", choices=["target", "draft"], default=None)
    parser.add_argument("--target-steps", type=int, default=1300)
    parser.add_argument("--draft-steps", type=int, default=1500)
    parser.add_argument("--draft-distill-steps", type=int, default=500, help="distil the draft from the saved target")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--ckpt-every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus-root", default=None,
                        help="train on .py files under this folder (default: the stdlib)")
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

    if args.only in (None, "target"):
        train_target(tokenizer, streams, args)
    if args.only in (None, "draft"):
        train_draft(tokenizer, streams, args)


if __name__ == "__main__":
    main()
