"""Measure what the embedded text pair writes, for its model card: on held-out prompts, the share of completions
without a syntax error (`syntax_valid`), their distinct-n (unique n-grams over all n-grams of a completion's tokens,
averaged), and the share that loops (a piece of 2 to 40 characters with a letter in it repeated at least 4 times
back to back, as in "a list of a list of a list of a list", not indentation or a "# ====" rule; or one line of 8 or
more characters 3 or more times), greedy and sampled.

    python -m mmspec.eval.text_zoo_card            # 64 held-out prompts, 96 new tokens (~2 min on 2 CPU cores)
    python -m mmspec.eval.text_zoo_card --quick    # 16 prompts
"""

from __future__ import annotations

import argparse
import re
import statistics
from collections import Counter
from pathlib import Path

import torch
from tqdm.auto import tqdm

from mmspec.eval.devices import write_json
from mmspec.pipelines.text import SpeculativeTextPipeline
from mmspec.zoo import TEXT_DRAFT, TEXT_TARGET
from mmspec.zoo.text_corpus import held_out_prompts, syntax_valid

RESULTS = Path("eval") / "results" / "text_zoo_card.json"
LOOP = re.compile(r"(.{2,40}?)\1{3,}")  # a piece repeated 4+ times in a row
SETTINGS = {"greedy": dict(temperature=0.0), "sampled, T 0.8, top-p 0.95": dict(temperature=0.8, top_p=0.95)}


def distinct(tokens: list[int], n: int) -> float:
    """Unique n-grams over all n-grams of `tokens` (1.0 for fewer than n tokens)."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def loops(text: str) -> bool:
    """Whether `text` loops: a line with a piece with a letter in it repeated 4+ times in a row, or the same line
    of 8 or more characters (indentation aside) 3 or more times."""
    lines = text.splitlines()
    within = any(re.search(r"[A-Za-z]", m.group(1)) for line in lines for m in LOOP.finditer(line))
    counts = Counter(line.strip() for line in lines if len(line.strip()) >= 8)
    return within or any(count >= 3 for count in counts.values())


def measure(pipe, prompts: list[str], new_tokens: int, batch_size: int, sampling: dict, seed: int) -> dict:
    """The card's figures for `prompts` completed with `sampling` (the target's own law: decoding="ar")."""
    completions, token_lists = [], []
    generator = torch.Generator().manual_seed(seed)
    for start in tqdm(range(0, len(prompts), batch_size), desc=str(sampling), leave=False):
        batch = prompts[start : start + batch_size]
        out = pipe(batch, decoding="ar", max_new_tokens=new_tokens, generator=generator, **sampling)
        completions += out.texts
        token_lists += [out.sequences[b, -new_tokens:][: int(out.stats.new_tokens[b])].tolist()
                        for b in range(len(batch))]
    return {
        "syntax_valid_share": round(statistics.fmean(syntax_valid(p + c) for p, c in zip(prompts, completions,
                                                                                         strict=True)), 4),
        **{f"distinct_{n}": round(statistics.fmean(distinct(t, n) for t in token_lists), 4) for n in (1, 2, 3)},
        "looping_share": round(statistics.fmean(loops(c) for c in completions), 4),
        "examples": [p + c for p, c in zip(prompts[:3], completions[:3], strict=True)],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=64, help="held-out prompts")
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0, help="of the sampled completions")
    parser.add_argument("--quick", action="store_true", help="16 prompts")
    parser.add_argument("--json", default=str(RESULTS), help="where to write the figures")
    args = parser.parse_args(argv)
    if args.prompts < 1 or args.new_tokens < 1 or args.batch_size < 1:
        parser.error("--prompts, --new-tokens and --batch-size must be >= 1")
    prompts = held_out_prompts(16 if args.quick else args.prompts)
    pipe = SpeculativeTextPipeline.from_pretrained(TEXT_TARGET, draft=TEXT_DRAFT)
    pipe.set_progress_bar_config(disable=True)
    report = {"prompts": len(prompts), "new_tokens": args.new_tokens, "model": TEXT_TARGET}
    for name, sampling in SETTINGS.items():
        report[name] = measure(pipe, prompts, args.new_tokens, args.batch_size, sampling, args.seed)
        figures = {k: v for k, v in report[name].items() if k != "examples"}
        print(f"{name}: {figures}")
    write_json(args.json, report)
    print(f"wrote {args.json}")
    return report


if __name__ == "__main__":
    main()
