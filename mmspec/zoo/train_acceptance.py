"""Train SpecDec++'s acceptance head (`AcceptanceHead`) for a draft model against its target.

    python -m mmspec.zoo.train_acceptance                   # the embedded pair: writes pycode/acceptance_head/
    python -m mmspec.zoo.train_acceptance --target my-lm --draft my-draft --out-dir my-draft-acceptance

1. Samples: the target continues 32-token windows of the code corpus at temperature 1 (SpecDec++ trains on the
   target's own responses), kept in `--work-dir` and reused.
2. Examples: both models re-read every sample (teacher forcing). At each position the draft model's feature h (the
   input of its LM head) gave its law q; the target's is p (temperature 1). A sampled example draws x from q and is
   labelled min(1, p(x) / q(x)), the exact rule's acceptance of x; a greedy example takes the draft's argmax and is
   labelled 1 where the target's argmax is the same token, else 0. Inputs: h, the draft's embedding of x, and
   statistics of q at x (`AcceptanceHead.statistics`: log q(x), log max q, entropy).
3. Training: binary cross-entropy with the soft labels on both outputs. Held-out samples give each output's loss,
   mean prediction against mean label, and its calibration error (ECE over 10 bins).
4. The stop threshold (`AcceptanceHead.stop_threshold`, per output): SpecDec++ stops a draft once the predicted
   probability that one of its tokens is rejected, 1 - r_k, exceeds h. Drafting token k + 1 adds r_k a_{k+1}
   expected tokens to the round at the cost of one draft forward, c = draft forward / target forward of the round's
   time T (1 + K c) for K drafts, which buys tau c / (1 + K c) tokens at the round's rate tau. With a_{k+1} taken
   at its held-out mean a, drafting pays while r_k > tau c / ((1 + K c) a): h = 1 - tau c / ((1 + K c) a), with
   tau = 1 + a + ... + a^K and K = 4 (the default draft length). c is measured here, on this machine.

Checkpoints in the work folder let an interrupted run resume.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from mmspec.adapters.causal_lm import Prompt
from mmspec.adapters.features import FeatureTap
from mmspec.adapters.static_cache import as_static_model
from mmspec.core.runtime.measured import median_seconds
from mmspec.models.acceptance import AcceptanceHead
from mmspec.zoo import TEXT_DRAFT, TEXT_TARGET, ZOO_DIR, load_causal_lm, resolve_model
from mmspec.zoo.train_heads import TextTeacher, load_samples
from mmspec.zoo.training import check_arguments, save_stage, train_loop

logger = logging.getLogger(__name__)
DRAFT_LENGTH = 4  # K in the threshold's derivation: the text drafters' default draft length
MODES = ("greedy", "sampled")  # the head's two outputs


@torch.no_grad()
def examples(target, draft, samples: torch.Tensor, generator: torch.Generator, batch_size: int = 32) -> dict:
    """The examples of `samples` [n, T] (see the module docstring): features [N, d], tokens [N, 2] (greedy,
    sampled), statistics [N, 2, 3] (of q at each), labels [N, 2]."""
    tap = FeatureTap.of(draft.get_output_embeddings())
    parts = []
    for start in range(0, len(samples), batch_size):
        batch = samples[start : start + batch_size]
        p = target(input_ids=batch).logits.float().softmax(-1)[:, :-1]  # position t's law of token t + 1
        draft_logits = draft(input_ids=batch).logits.float()[:, :-1]
        q = draft_logits.softmax(-1)
        features = tap.feature[:, :-1].float()
        sampled = torch.multinomial(q.flatten(0, 1), 1, generator=generator).view(q.shape[:2])
        greedy = q.argmax(-1)
        tokens = torch.stack([greedy, sampled], -1)  # [b, T - 1, 2]
        q_x, p_x = q.gather(-1, tokens), p.gather(-1, tokens)
        labels = torch.stack([(p.argmax(-1) == greedy).float(), (p_x[..., 1] / q_x[..., 1]).clamp(max=1)], -1)
        statistics = AcceptanceHead.statistics(draft_logits[..., None, :].expand(-1, -1, 2, -1), tokens)
        parts.append((features.flatten(0, 1), tokens.flatten(0, 1), statistics.flatten(0, 1), labels.flatten(0, 1)))
    features, tokens, statistics, labels = (torch.cat(x) for x in zip(*parts, strict=True))
    return {"features": features, "tokens": tokens, "statistics": statistics, "labels": labels}


def head_logits(head: AcceptanceHead, embedding: torch.nn.Module, data: dict) -> torch.Tensor:
    """[N, 2]: the head's logit for each example of each output (the greedy one on the greedy token, the sampled
    one on the sampled token)."""
    out = [head(data["features"], embedding(data["tokens"][:, m]), data["statistics"][:, m])[:, m]
           for m in range(len(MODES))]
    return torch.stack(out, -1)


def calibration_error(predicted: torch.Tensor, labels: torch.Tensor, bins: int = 10) -> float:
    """ECE: the example-weighted mean |mean prediction - mean label| over equal-width bins of the prediction."""
    which = (predicted * bins).long().clamp(max=bins - 1)
    error = 0.0
    for b in range(bins):
        inside = which == b
        if inside.any():
            error += inside.float().mean().item() * abs(predicted[inside].mean().item() - labels[inside].mean().item())
    return error


@torch.no_grad()
def held_out_metrics(head: AcceptanceHead, embedding: torch.nn.Module, data: dict) -> dict:
    predicted = head_logits(head, embedding, data).sigmoid()
    labels = data["labels"]
    metrics = {}
    for m, mode in enumerate(MODES):
        metrics[mode] = {
            "loss": round(F.binary_cross_entropy(predicted[:, m], labels[:, m]).item(), 4),
            "constant_loss": round(F.binary_cross_entropy(labels[:, m].mean().expand_as(labels[:, m]),
                                                          labels[:, m]).item(), 4),  # the best constant's
            "mean_predicted": round(predicted[:, m].mean().item(), 4),
            "mean_label": round(labels[:, m].mean().item(), 4),
            "calibration_error": round(calibration_error(predicted[:, m], labels[:, m]), 4),
        }
    return metrics


@torch.no_grad()
def cost_ratio(target, draft, context: int = 64, repeats: int = 50) -> float:
    """One cached one-token forward of the draft over one of the target, at batch 1 after `context` tokens."""
    def seconds(model) -> float:
        adapter = as_static_model(model, context + 2)
        ids = torch.randint(0, model.config.vocab_size, (1, context + 1), generator=torch.Generator().manual_seed(0))
        state, _ = adapter.prefill(Prompt(ids[:, :-1], torch.ones(1, context, dtype=torch.bool)))
        keep = torch.zeros(1, dtype=torch.long)
        return median_seconds(lambda: adapter.forward(ids[:, -1:], state), torch.device("cpu"), repeats,
                              after=lambda: adapter.rollback(state, keep))

    return seconds(draft) / seconds(target)


def stop_threshold(acceptance: float, cost: float, draft_length: int = DRAFT_LENGTH) -> float:
    """h = 1 - tau c / ((1 + K c) a), tau = 1 + a + ... + a^K (module docstring), kept inside [0.05, 0.95]."""
    tau = sum(acceptance**i for i in range(draft_length + 1))
    h = 1 - tau * cost / ((1 + draft_length * cost) * max(acceptance, 1e-3))
    return round(min(max(h, 0.05), 0.95), 4)


def add_sample_arguments(parser: argparse.ArgumentParser, draft_help: str | None = None,
                         held_out: bool = True) -> None:
    """The target, its draft (where `draft_help` says what it is for), the target samples kept in the work folder
    (`target_samples`) and, with `held_out`, how many of them the metrics keep out of training."""
    parser.add_argument("--target", default=TEXT_TARGET, help="a zoo name or a local transformers causal LM")
    if draft_help is not None:
        parser.add_argument("--draft", default=TEXT_DRAFT, help=draft_help)
    parser.add_argument("--samples", type=int, default=768, help="target samples")
    if held_out:
        parser.add_argument("--held-out", type=int, default=64, help="samples kept out of training for the metrics")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens each sample continues its prompt")
    parser.add_argument("--sample-batch", type=int, default=64)
    parser.add_argument("--work-dir", default=None, help="where the samples are kept (default: ~/.cache/mmspec/"
                        "train_acceptance/<the pair's folder>, shared by train_acceptance, train_vocabulary and "
                        "train_kangaroo)")
    parser.add_argument("--seed", type=int, default=0)


def check_sample_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace,
                           positive: tuple[str, ...]) -> None:
    """`add_sample_arguments`' checks and the command's own `positive` ones, before any model loads."""
    if args.held_out >= args.samples:
        parser.error(f"--held-out ({args.held_out}) must be below --samples ({args.samples})")
    check_arguments(parser, args, ("samples", "held_out", "new_tokens", "sample_batch", *positive),
                    ("target", "draft") if hasattr(args, "draft") else ("target",))


def work_folder(args) -> Path:
    """--work-dir, or the default one of the pair's folder (made if missing): the draft's, else the target's."""
    flag = "--draft" if hasattr(args, "draft") else "--target"
    name = Path(str(resolve_model(getattr(args, flag[2:]), flag))).parent.name
    work = Path(args.work_dir or Path.home() / ".cache" / "mmspec" / "train_acceptance" / name)
    work.mkdir(parents=True, exist_ok=True)
    return work


def target_samples(args, target, tokenizer) -> torch.Tensor:
    """[n, 32 + new tokens]: the target's samples (`add_sample_arguments`), drawn or read back from the work folder."""
    target.requires_grad_(False)
    return load_samples(TextTeacher(target, tokenizer), SimpleNamespace(
        samples=args.samples, sample_batch=args.sample_batch, new_tokens=args.new_tokens, seed=args.seed,
        prompts=None), work_folder(args))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sample_arguments(parser, "the draft model the head is for (same tokenizer)")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=512, help="examples per step")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--out-dir", default=None, help="default: the embedded pair's folder, pycode/ (the head "
                        "goes to <out-dir>/acceptance_head)")
    args = parser.parse_args(argv)
    check_sample_arguments(parser, args, ("steps", "batch_size", "hidden", "layers"))

    target, tokenizer = load_causal_lm(args.target)
    draft, _ = load_causal_lm(args.draft)
    draft.requires_grad_(False)
    started = time.perf_counter()
    samples = target_samples(args, target, tokenizer)
    generator = torch.Generator().manual_seed(args.seed)
    train = examples(target, draft, samples[: -args.held_out], generator)
    held_out = examples(target, draft, samples[-args.held_out :], generator)
    labelling_seconds = time.perf_counter() - started
    embedding = draft.get_input_embeddings()
    head = AcceptanceHead(feature_size=draft.config.hidden_size, hidden=args.hidden, layers=args.layers)
    n = len(train["labels"])

    def batch_fn(generator):
        index = torch.randint(0, n, (args.batch_size,), generator=generator)
        return {key: value[index] for key, value in train.items()}

    def loss(model, batch):
        total = F.binary_cross_entropy_with_logits(head_logits(model, embedding, batch), batch["labels"])
        return total, total

    seconds = train_loop("acceptance_head", head, steps=args.steps, lr=args.lr, loss_fn=loss, batch_fn=batch_fn,
                         work_dir=work_folder(args), seed=args.seed)
    metrics = held_out_metrics(head, embedding, held_out)
    cost = cost_ratio(target, draft)
    thresholds = [stop_threshold(metrics[mode]["mean_label"], cost) for mode in MODES]
    training = {"target": str(args.target), "draft": str(args.draft), "draft_target_cost_ratio": round(cost, 4),
                "examples": n, "held_out_examples": len(held_out["labels"])}
    head.register_to_config(stop_threshold=tuple(thresholds), training=training)
    out_dir = Path(args.out_dir) if args.out_dir else ZOO_DIR / "pycode"
    metrics = {**metrics, **training, "stop_threshold": dict(zip(MODES, thresholds, strict=True)),
               "labelling_seconds": round(labelling_seconds, 1)}
    metrics = save_stage(head.half(), out_dir / "acceptance_head", metrics, args.steps, args.batch_size, seconds)
    print(json.dumps(metrics, indent=2))


if __name__ == "__main__":
    main()
