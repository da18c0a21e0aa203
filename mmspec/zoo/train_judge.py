"""Train judge decoding's judge (`JudgeHead`) for a target and its draft model on code, with labels mined from the
task itself (AutoJudge's idea, Garipov et al. 2025, arXiv 2504.20039), and choose the threshold it keeps tokens at.

    python -m mmspec.zoo.train_judge                        # the embedded pair: writes pycode/judge_head/
    python -m mmspec.zoo.train_judge --precision 0.95       # a stricter judge

1. Completions: the target completes `--prompts` function prompts of the corpus's train split greedily.
2. Mismatches: the draft model reads each completion (teacher forcing). Where its greedy token d differs from the
   target's x at position t, the exact greedy rule rejects d: those are the tokens a judge can keep.
3. Labels: d is swapped in at t and the target continues greedily to the end of the next line (LINES), as it would
   after judge decoding kept d. The label is 1 where the code up to there has no syntax error (`syntax_valid`, the
   task metric) and the target itself finds d plausible there (p(d) at least `--plausibility` times p(x): syntax
   alone almost never breaks from one token, since the target repairs it, and says nothing of what the code means),
   else 0. Mismatches whose lines do not end within `--line-tokens`, or whose lines the target's own completion
   already breaks, are left out.
4. Features: the target's feature of d at t (the input of its LM head at d's slot, reading the prefix and d), as the
   verification forward gives it.
5. Training: class-balanced logistic regression on a training share; on the held-out rest the threshold is the
   lowest score at which the judged-good mismatches are good at `--precision` or more (the judge's precision bounds
   how often it keeps a token that breaks the code). Accuracy, AUC and the kept share of mismatches at that
   threshold go to `training_metrics.json` beside the head.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from mmspec.adapters.features import FeatureTap
from mmspec.models.judge import JudgeHead
from mmspec.text.online import positions_of
from mmspec.zoo import TEXT_DRAFT, TEXT_TARGET, ZOO_DIR, load_causal_lm
from mmspec.zoo.text_corpus import code_prompts, syntax_valid
from mmspec.zoo.training import check_arguments, save_stage

HELD_OUT_SHARE = 0.25
LINES = 2  # a swap is judged on its own line and the next: an unclosed bracket breaks the line after it


@torch.no_grad()
def completions(target, tokenizer, prompts: list[str], new_tokens: int, batch_size: int) -> list[torch.Tensor]:
    """Each prompt's ids followed by the target's greedy completion (up to EOS), unpadded."""
    rows = []
    for start in tqdm(range(0, len(prompts), batch_size), desc="completions"):
        encoded = tokenizer(prompts[start : start + batch_size], return_tensors="pt", padding=True,
                            padding_side="left")
        out = target.generate(**encoded, max_new_tokens=new_tokens, do_sample=False,
                              pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        width = encoded["input_ids"].shape[1]
        for b in range(out.shape[0]):
            new = out[b, width:]
            ended = (new == tokenizer.eos_token_id).nonzero()
            new = new[: int(ended[0]) + 1] if len(ended) else new
            rows.append(torch.cat([encoded["input_ids"][b][encoded["attention_mask"][b].bool()], new]))
    return rows


def left_padded(rows: list[torch.Tensor], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, width - len(row) :], mask[b, width - len(row) :] = row, 1
    return ids, mask


@torch.no_grad()
def mismatches(draft, rows: list[torch.Tensor], prompt_lengths: list[int]) -> list[tuple[int, int, int]]:
    """(row, t, d): every completion position t where the draft's greedy token d differs from the target's."""
    found = []
    for row, (ids, length) in enumerate(zip(rows, prompt_lengths, strict=True)):
        logits = draft(input_ids=ids[None]).logits[0]
        greedy = logits[length - 1 : len(ids) - 1].argmax(-1)  # the logit at t - 1 predicts token t
        for offset in (greedy != ids[length:]).nonzero().squeeze(-1).tolist():
            found.append((row, length + offset, int(greedy[offset])))
    return found


def line_of(tokenizer, ids: torch.Tensor, start: int, lines: int = LINES) -> str | None:
    """The code of `ids` up to the end of the `lines`-th line from the one token `start` is on (None: it does not
    end there)."""
    text, end = tokenizer.decode(ids), len(tokenizer.decode(ids[:start])) - 1
    for _ in range(lines):
        end = text.find("\n", end + 1)
        if end < 0:
            return None
    return text[: end + 1]


@torch.no_grad()
def labelled(target, tokenizer, rows: list[torch.Tensor], found: list[tuple[int, int, int]], line_tokens: int,
             batch_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(features [M, d], valid [M] bool, ratio [M]) of the mismatches that can be labelled (module docstring, 3 and
    4): whether the code stays free of syntax errors after the swap, and the target's p(d) / p(x) at t."""
    tap = FeatureTap.of(target.get_output_embeddings())
    features, valid, ratios = [], [], []
    pad = tokenizer.pad_token_id
    for start in tqdm(range(0, len(found), batch_size), desc="labels"):
        batch = found[start : start + batch_size]
        swapped = [torch.cat([rows[r][:t], torch.tensor([d])]) for r, t, d in batch]
        ids, mask = left_padded(swapped, pad)
        law = target(input_ids=ids, attention_mask=mask, position_ids=positions_of(ids, mask)).logits[:, -2].softmax(-1)
        feature = tap.feature[:, -1].float()
        out = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=line_tokens, do_sample=False,
                              pad_token_id=pad, eos_token_id=tokenizer.eos_token_id)
        for b, (r, t, d) in enumerate(batch):
            continued = torch.cat([swapped[b], out[b, ids.shape[1] :]])
            kept, own = line_of(tokenizer, continued, t), line_of(tokenizer, rows[r], t)
            if kept is None or own is None or not syntax_valid(own):
                continue
            features.append(feature[b])
            valid.append(syntax_valid(kept))
            ratios.append(float(law[b, d] / law[b, rows[r][t]]))
    return torch.stack(features), torch.tensor(valid), torch.tensor(ratios)


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """The probability that a good example scores above a bad one (ties count half)."""
    good, bad = scores[labels == 1], scores[labels == 0]
    if not len(good) or not len(bad):
        return float("nan")
    above = (good[:, None] > bad[None]).float() + 0.5 * (good[:, None] == bad[None]).float()
    return float(above.mean())


def precise_threshold(scores: torch.Tensor, labels: torch.Tensor, precision: float, least: int = 10) -> float:
    """The lowest score threshold whose judged-good examples (score above it) are good at `precision` or more, over
    at least `least` of them; 0.99 where none is."""
    order = scores.argsort(descending=True)
    good = labels[order].cumsum(0) / torch.arange(1, len(order) + 1)
    ok = (good >= precision) & (torch.arange(1, len(order) + 1) >= least)
    if not bool(ok.any()):
        return 0.99
    last = int(ok.nonzero().max())  # the most examples kept at the precision
    return round(min(max(float(scores[order[last]]) - 1e-4, 0.01), 0.99), 4)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=TEXT_TARGET, help="a zoo name or a local transformers causal LM")
    parser.add_argument("--draft", default=TEXT_DRAFT, help="the draft model the judge judges (same tokenizer)")
    parser.add_argument("--prompts", type=int, default=512, help="function prompts of the train split")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens of each target completion")
    parser.add_argument("--line-tokens", type=int, default=32, help="the most tokens the target continues a swap")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=800, help="logistic regression steps")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--plausibility", type=float, default=0.1,
                        help="a swap is also good only where the target gives the draft token at least this share "
                             "of its own token's probability")
    parser.add_argument("--precision", type=float, default=0.9,
                        help="the share of judged-good mismatches that must keep the code valid")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", default=None, help="default: the embedded pair's folder, pycode/ (the head "
                        "goes to <out-dir>/judge_head)")
    args = parser.parse_args(argv)
    if not 0 < args.precision < 1:
        parser.error(f"--precision must be in (0, 1), got {args.precision}")
    if not 0 <= args.plausibility <= 1:
        parser.error(f"--plausibility must be in [0, 1], got {args.plausibility}")
    check_arguments(parser, args, ("prompts", "new_tokens", "line_tokens", "batch_size", "steps"), ("target", "draft"))

    target, tokenizer = load_causal_lm(args.target)
    draft, _ = load_causal_lm(args.draft)
    started = time.perf_counter()
    prompts = code_prompts(args.prompts, "train")
    rows = completions(target, tokenizer, prompts, args.new_tokens, args.batch_size)
    prompt_lengths = [len(tokenizer(p)["input_ids"]) for p in prompts]
    found = mismatches(draft, rows, prompt_lengths)
    features, valid, ratios = labelled(target, tokenizer, rows, found, args.line_tokens, args.batch_size)
    labels = (valid & (ratios >= args.plausibility)).float()
    mining_seconds = time.perf_counter() - started

    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(args.seed))
    cut = int(len(order) * (1 - HELD_OUT_SHARE))
    train, held_out = order[:cut], order[cut:]
    head = JudgeHead(feature_size=features.shape[1])
    optimizer = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.01)
    positive = labels[train].mean().clamp(0.01, 0.99)
    weights = torch.where(labels[train] == 1, 0.5 / positive, 0.5 / (1 - positive))  # class-balanced
    began = time.perf_counter()
    for _ in tqdm(range(args.steps), desc="train judge_head"):
        loss = F.binary_cross_entropy_with_logits(head(features[train]), labels[train], weight=weights)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    seconds = time.perf_counter() - began
    with torch.no_grad():
        scores = head.score(features[held_out])
    threshold = precise_threshold(scores, labels[held_out], args.precision)
    kept = scores > threshold
    metrics = {
        "target": str(args.target), "draft": str(args.draft), "prompts": args.prompts,
        "mismatches": len(found), "labelled": len(labels), "good_share": round(float(labels.mean()), 4),
        "syntax_valid_share": round(float(valid.float().mean()), 4), "plausibility": args.plausibility,
        "plausible_share": {f"{c:g}": round(float((ratios >= c).float().mean()), 4) for c in (0.05, 0.1, 0.25, 0.5)},
        "held_out": {"examples": len(held_out), "accuracy": round(float(((scores > 0.5) == labels[held_out].bool())
                                                                        .float().mean()), 4),
                     "auc": round(auc(scores, labels[held_out]), 4),
                     "kept_share_at_threshold": round(float(kept.float().mean()), 4),
                     "precision_at_threshold": round(float(labels[held_out][kept].mean()), 4) if bool(kept.any())
                     else None},
        "threshold": threshold, "mining_seconds": round(mining_seconds, 1),
    }
    head.register_to_config(threshold=threshold, training={"target": str(args.target), "draft": str(args.draft),
                                                           "precision": args.precision})
    out_dir = Path(args.out_dir) if args.out_dir else ZOO_DIR / "pycode"
    metrics = save_stage(head.half(), out_dir / "judge_head", metrics, args.steps, len(train), seconds)
    print(json.dumps(metrics, indent=2))


if __name__ == "__main__":
    main()
