"""What the parity scripts share: their arguments, the upstream checkout on the import path, its commit, the JSON."""
import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

REPOSITORY = Path(__file__).resolve().parents[2]


def arguments(work: bool = True) -> argparse.Namespace:
    """--upstream (a checkout of the family's repository), --deps (a `pip install --target` folder of what its code
    imports beyond torch and transformers), --work (where upstream's files are saved), --json (the results); the
    checkout and the deps go first on the import path, this repository last."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--deps", required=True)
    if work:
        parser.add_argument("--work", required=True, help="folder for the files upstream saves")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    sys.path[:0] = [args.deps, args.upstream]
    sys.path.append(str(REPOSITORY))
    return args


def upstream_commit(args: argparse.Namespace) -> str:
    return subprocess.run(["git", "-C", args.upstream, "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()


def randomised(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with every weight drawn from N(0, 0.2²): transformers' init is near zero, so logits would tie and
    compare trivially."""
    for parameter in model.parameters():
        torch.nn.init.normal_(parameter, std=0.2)
    return model


def write(results: dict, args: argparse.Namespace) -> None:
    with open(args.json, "w") as file:
        json.dump(results, file, indent=1)
    print(json.dumps(results))


def greedy_and_guided(adapter, condition, local_tokens, guidance: float):
    """What mmspec makes of a family's prompts: greedy AR and SJD (window 5) image-span tokens [B, N] (local ids),
    and the guided logits [B, N, V] of each span position teacher-forced on `local_tokens` [B, N] (local ids)."""
    from mmspec.core.probs import SamplingConfig
    from mmspec.image import AR, SJD
    from tests.models.family_checks import run

    sampling = SamplingConfig(0, guidance_scale=guidance)
    ar, sjd = (run(decoding, adapter, condition, sampling)[0] for decoding in (AR(), SJD(window=5)))
    state, first = adapter.prefill(condition, cfg=guidance != 1.0)
    rest = adapter.forward(local_tokens[:, :-1], state)
    guided = torch.cat([first.cond, rest.cond], 1)
    if guidance != 1.0:
        uncond = torch.cat([first.uncond, rest.uncond], 1)
        guided = uncond + guidance * (guided - uncond)
    return ar, sjd, guided


def score_recorder(columns: torch.Tensor):
    """A transformers logits processor, last in a list, that keeps the scores of `columns` at every step
    (`.steps`: one [B, len(columns)] tensor per step)."""
    from transformers import LogitsProcessor

    class Recorder(LogitsProcessor):
        def __init__(self):
            self.steps = []

        def __call__(self, input_ids, scores):
            self.steps.append(scores[:, columns].clone())
            return scores

    return Recorder()


def parity_row(guidance: float, ours: tuple, theirs: tuple, positions=slice(None), law: bool = False) -> dict:
    """One table row: ours = (AR tokens, SJD tokens, guided logits), theirs = (tokens, guided logits or log-laws);
    law: compare log-probabilities (log_softmax of ours) instead of logits; positions: the span positions compared."""
    ar, sjd, guided = ours
    tokens, reference = theirs
    guided = guided.log_softmax(-1) if law else guided
    name = "guided_log_law" if law else "guided_logits"
    return {"guidance": guidance, f"{name}_max_abs_diff": float((guided - reference)[:, positions].abs().max()),
            f"{name}_scale": float(reference[:, positions].abs().max()),
            "greedy_ar_equal": float((ar == tokens).float().mean()),
            "greedy_sjd_equal": float((sjd == tokens).float().mean())}
