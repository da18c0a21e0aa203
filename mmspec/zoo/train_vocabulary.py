"""Rank a target's tokens by how often it writes them, for VocabTrim's draft vocabularies (of its draft LM and its
draft heads).

    python -m mmspec.zoo.train_vocabulary                     # the embedded target: writes pycode/target/config.json
    python -m mmspec.zoo.train_vocabulary --target my-lm-folder

The target continues 32-token windows of the code corpus at temperature 1 (VocabTrim, Goel et al. 2025: the
target's own text is the calibration set that keeps acceptance best); the tokens it wrote are counted, and the
target's `config.json` gets `token_ranking` (every token id, most frequent first; ties and unseen ids by id) with
`token_ranking_tokenizer` (the SHA-256 of the tokenizer file it counted with: which ids the ranking means).
`TextDraftModel(draft_vocabulary=N)` and `TextDraftHeads(draft_vocabulary=N)` keep the first N ids
and the special tokens. The samples are kept in `--work-dir` (shared with `mmspec.zoo.train_acceptance`) and reused.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import torch

from mmspec.zoo import load_causal_lm, resolve_model
from mmspec.zoo.train_acceptance import add_sample_arguments, target_samples

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
    add_sample_arguments(parser, held_out=False)
    args = parser.parse_args(argv)
    for name in ("samples", "new_tokens", "sample_batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    try:
        target_folder = Path(resolve_model(args.target, "--target"))
    except ValueError as error:
        parser.error(str(error))
    if not (target_folder / "config.json").is_file() or not (target_folder / "tokenizer.json").is_file():
        parser.error(f"--target: {target_folder} needs a config.json and a tokenizer.json")

    target, tokenizer = load_causal_lm(args.target)
    written = target_samples(args, target, tokenizer)[:, PROMPT_TOKENS:]
    ranking = token_ranking(written, target.config.vocab_size)
    config_path = target_folder / "config.json"
    config = json.loads(config_path.read_text())
    config.update(token_ranking=ranking, token_ranking_tokenizer=tokenizer_digest(target_folder))
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    seen = int((torch.bincount(written.flatten(), minlength=len(ranking)) > 0).sum())
    print(f"{written.numel()} tokens counted, {seen} of {len(ranking)} ids seen; ranking written to {config_path}")


if __name__ == "__main__":
    main()
