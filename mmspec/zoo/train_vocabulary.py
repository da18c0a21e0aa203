"""Rank a draft model's tokens by how often its target writes them, for VocabTrim's draft vocabularies.

    python -m mmspec.zoo.train_vocabulary                     # the embedded pair: writes pycode/draft/config.json
    python -m mmspec.zoo.train_vocabulary --target my-lm --draft my-draft-folder

The target continues 32-token windows of the code corpus at temperature 1 (VocabTrim, Goel et al. 2025: the
target's own text is the calibration set that keeps acceptance best); the tokens it wrote are counted, and the draft
model's `config.json` gets `token_ranking` (every token id, most frequent first; ties and unseen ids by id) with
`token_ranking_tokenizer` (the SHA-256 of the tokenizer file it counted with: which ids the ranking means).
`TextSpeculation(drafter="model", draft_vocabulary=N)` keeps the first N ids and the special tokens. The samples are
kept in `--work-dir` (shared with `mmspec.zoo.train_acceptance`) and reused.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import torch

from mmspec.zoo import TEXT_DRAFT, TEXT_TARGET, load_causal_lm, resolve_model
from mmspec.zoo.train_heads import TextTeacher, load_samples

PROMPT_TOKENS = 32  # the samples' prompt windows (corpus text, not counted)


def tokenizer_digest(folder: Path) -> str:
    """SHA-256 of a model folder's tokenizer.json (the ids a ranking refers to)."""
    return hashlib.sha256((Path(folder) / "tokenizer.json").read_bytes()).hexdigest()


def token_ranking(tokens: torch.Tensor, vocab_size: int) -> list[int]:
    """Every id in [0, vocab_size), most frequent in `tokens` first (ties, unseen ids included, by id)."""
    counts = torch.bincount(tokens.flatten(), minlength=vocab_size)
    return torch.sort(-counts, stable=True).indices.tolist()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=TEXT_TARGET, help="a zoo name or a local transformers causal LM")
    parser.add_argument("--draft", default=TEXT_DRAFT, help="the draft model folder whose config.json gets the ranking")
    parser.add_argument("--samples", type=int, default=768, help="target samples to count")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens each sample continues its prompt")
    parser.add_argument("--sample-batch", type=int, default=64)
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("samples", "new_tokens", "sample_batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    try:
        draft_folder = Path(resolve_model(args.draft, "--draft"))
        resolve_model(args.target, "--target")
    except ValueError as error:
        parser.error(str(error))
    if not (draft_folder / "config.json").is_file() or not (draft_folder / "tokenizer.json").is_file():
        parser.error(f"--draft: {draft_folder} needs a config.json and a tokenizer.json")

    target, tokenizer = load_causal_lm(args.target)
    work = Path(args.work_dir or Path.home() / ".cache" / "mmspec" / "train_acceptance" / draft_folder.parent.name)
    work.mkdir(parents=True, exist_ok=True)
    samples = load_samples(TextTeacher(target, tokenizer), SimpleNamespace(
        samples=args.samples, sample_batch=args.sample_batch, new_tokens=args.new_tokens, seed=args.seed,
        prompts=None), work)
    written = samples[:, PROMPT_TOKENS:]
    ranking = token_ranking(written, target.config.vocab_size)
    config_path = draft_folder / "config.json"
    config = json.loads(config_path.read_text())
    config.update(token_ranking=ranking, token_ranking_tokenizer=tokenizer_digest(draft_folder))
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    seen = int((torch.bincount(written.flatten(), minlength=len(ranking)) > 0).sum())
    print(f"{written.numel()} tokens counted, {seen} of {len(ranking)} ids seen; ranking written to {config_path}")


if __name__ == "__main__":
    main()
