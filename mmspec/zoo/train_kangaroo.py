"""Train Kangaroo's exit adapter (`KangarooAdapter`) for a target: its first layers, the adapter and its LM head then
draft for it (`Kangaroo()`, `"kangaroo"`).

    python -m mmspec.zoo.train_kangaroo                     # the embedded target: writes pycode/kangaroo_adapter/
    python -m mmspec.zoo.train_kangaroo --target my-lm --exit-layer 2 --out-dir my-lm-kangaroo
    python -m mmspec.zoo.train_kangaroo --exit-layer 3 --exit-layers 2 3 4 6   # sorted: one adapter, four exits (S2D)

1. Samples: the target continues 32-token windows of the code corpus at temperature 1, kept in the work folder and
   shared with `train_acceptance` (Kangaroo trains on the target's own outputs, as EAGLE does).
2. Training: the frozen target re-reads a batch of samples (teacher forcing), which gives its law p at every
   position and its hidden state after every layer. The adapter reads the state at its exit (at each exit of
   `--exit-layers`: S2D's sorted fine-tuning, the losses of every exit averaged) and gives a law through the
   target's LM head (the draft `mmspec.adapters.views.kangaroo_view` runs: the target's first layers, the adapter,
   the head); only the adapter learns, on soft cross-entropy to p plus `--tv-weight` x the total variation to p
   (1 - alpha, the acceptance itself). The adapter starts from the attention of the target's layer after
   `--exit-layer` and its final norm (`KangarooAdapter.for_target`).
3. Held-out acceptance on samples kept out of training: alpha = E[sum min(p, q)] (the acceptance of a sampled draft
   at T = 1) and the top-1 agreement (greedy), for the adapter at each exit and for the plain early exit at
   `--exit-layer` (the layer-skip drafter), written to `training_metrics.json` beside the adapter.

Checkpoints in the work folder let an interrupted run resume.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from mmspec.adapters.nested_exits import NestedExits
from mmspec.adapters.views import early_exit_view, kangaroo_view
from mmspec.models.kangaroo import KangarooAdapter
from mmspec.zoo import ZOO_DIR, load_causal_lm
from mmspec.zoo.train_acceptance import add_sample_arguments, check_sample_arguments, target_samples, work_folder
from mmspec.zoo.train_heads import soft_cross_entropy
from mmspec.zoo.training import save_stage, total_variation, train_loop


def exit_losses(exits: NestedExits, target, tokens: torch.Tensor, tv_weight: float) -> tuple[torch.Tensor,
                                                                                           torch.Tensor]:
    """(loss to optimise, soft cross-entropy), averaged over the adapter's exits: its laws at each exit against the
    target's at every position of `tokens` ([R, T] long, whole samples)."""
    with torch.no_grad():
        output = target(input_ids=tokens, output_hidden_states=True)
        p = output.logits.float().softmax(-1)
    losses, entropies = [], []
    for logits in (logits.float() for logits in exits.exit_logits(output.hidden_states)):
        entropies.append(soft_cross_entropy(p, logits).mean())
        losses.append(entropies[-1] + tv_weight * total_variation(p, logits).mean())
    return torch.stack(losses).mean(), torch.stack(entropies).mean()


@torch.no_grad()
def held_out_acceptance(draft, target, samples: torch.Tensor, batch_size: int = 32) -> dict:
    """alpha = E[sum min(p, q)] and the top-1 agreement of `draft` with `target` over every position of `samples`."""
    alpha = agree = count = 0.0
    for start in range(0, len(samples), batch_size):
        tokens = samples[start : start + batch_size]
        p = target(input_ids=tokens).logits.float()
        q = draft(input_ids=tokens).logits.float()
        alpha += (1 - total_variation(p.softmax(-1), q)).sum().item()
        agree += (p.argmax(-1) == q.argmax(-1)).sum().item()
        count += tokens.numel()
    return {"alpha": round(alpha / count, 4), "top1_agreement": round(agree / count, 4)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sample_arguments(parser)
    parser.add_argument("--exit-layer", type=int, default=None,
                        help="the target's layers the adapter reads the output of (default: the config's "
                             "early_exit_layer)")
    parser.add_argument("--exit-layers", type=int, nargs="+", default=None,
                        help="sorted (S2D): every exit the adapter is trained for, --exit-layer among them")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=16, help="samples per step")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--tv-weight", type=float, default=1.0)
    parser.add_argument("--out-dir", default=None, help="default: the embedded target's folder, pycode/ (the adapter "
                        "goes to <out-dir>/kangaroo_adapter)")
    args = parser.parse_args(argv)
    check_sample_arguments(parser, args, ("steps", "batch_size"))
    if args.exit_layers is not None and (args.exit_layer is None or args.exit_layer not in args.exit_layers):
        parser.error(f"--exit-layers {args.exit_layers}: give --exit-layer, one of them (Kangaroo's exit)")

    target, tokenizer = load_causal_lm(args.target)
    exit_layer = args.exit_layer or getattr(target.config, "early_exit_layer", None)
    if exit_layer is None:
        parser.error("--exit-layer: the target's config names no early_exit_layer; give one")
    try:
        adapter = KangarooAdapter.for_target(target, exit_layer, args.exit_layers)
    except ValueError as error:
        parser.error(f"--exit-layer{'s' if args.exit_layers else ''}: {error}")
    samples = target_samples(args, target, tokenizer)  # freezes the target
    train, held_out = samples[: -args.held_out], samples[-args.held_out :]
    exits = NestedExits(target, adapter)

    def batch_fn(generator):
        return train[torch.randint(0, len(train), (args.batch_size,), generator=generator)]

    def loss(model, batch):
        return exit_losses(exits, target, batch, args.tv_weight)

    stage = "kangaroo_adapter" if args.exit_layers is None else "sorted_kangaroo_adapter"
    seconds = train_loop(stage, adapter, steps=args.steps, lr=args.lr, loss_fn=loss, batch_fn=batch_fn,
                         work_dir=work_folder(args), seed=args.seed, weight_decay=0.0)
    metrics = {"exit_layer": exit_layer, "exit_layers": list(adapter.exits), "target": str(args.target),
               "adapter": {layer: held_out_acceptance(kangaroo_view(target, adapter, layer), target, held_out)
                           for layer in adapter.exits},
               "plain_exit": held_out_acceptance(early_exit_view(target, exit_layer), target, held_out)}
    out_dir = Path(args.out_dir) if args.out_dir else ZOO_DIR / "pycode"
    metrics = save_stage(adapter.half(), out_dir / "kangaroo_adapter", metrics, args.steps, args.batch_size, seconds)
    print(json.dumps(metrics, indent=2))


if __name__ == "__main__":
    main()
