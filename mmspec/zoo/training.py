"""The resumable training loop shared by the zoo's training scripts (text and image models), and the measure of
a drafter they share."""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm.auto import tqdm

from mmspec.core.stats import synchronize

logger = logging.getLogger(__name__)


def add_stage_arguments(parser, stage: str, steps: int, batch_size: int, lr: float) -> None:
    """--<stage>-steps, --<stage>-batch-size, --<stage>-lr with their defaults (read back as args.<stage>_steps ...)."""
    parser.add_argument(f"--{stage}-steps", type=int, default=steps)
    parser.add_argument(f"--{stage}-batch-size", type=int, default=batch_size)
    parser.add_argument(f"--{stage}-lr", type=float, default=lr)


def add_minutes_argument(parser, stage: str) -> None:
    """--<stage>-minutes (read back as args.<stage>_minutes; None = use --<stage>-steps): see `budgeted_steps`."""
    parser.add_argument(f"--{stage}-minutes", type=float, default=None, metavar="M",
                        help=f"train for about M minutes on this machine instead of --{stage}-steps: the step count "
                             "is set from the speed of a few throwaway steps (a resumed run keeps its own)")


def check_minutes(parser: argparse.ArgumentParser, args: argparse.Namespace, stages: tuple[str, ...]) -> None:
    """Each --<stage>-minutes given is > 0 (else the parser exits 2 naming the flag)."""
    for stage in stages:
        minutes = getattr(args, f"{stage}_minutes")
        if minutes is not None and not minutes > 0:
            parser.error(f"--{stage}-minutes must be > 0, got {minutes}")


def add_autoencoder_arguments(parser, model: str, config: dict) -> None:
    """--vae-from (a saved pipeline whose autoencoder to keep) and --latent-channels (of one trained here; `config`:
    the shipped one's); `autoencoder_config` reads them back."""
    parser.add_argument("--vae-from", default=None, metavar="PIPELINE_DIR",
                        help=f"take this saved {model} pipeline's autoencoder (and its metrics) instead of training "
                             "one, so that a retrained model keeps the shipped latents")
    parser.add_argument("--latent-channels", type=int, default=None,
                        help=f"channels of the autoencoder trained here, the size of the latents the model "
                             f"generates (default {config['embed_dim']}, the shipped one's)")


def autoencoder_config(parser: argparse.ArgumentParser, args: argparse.Namespace, config: dict) -> dict:
    """`config` with --latent-channels as its embed_dim (the parser exits 2 for one below 1 or beside --vae-from)."""
    if args.latent_channels is not None and (args.vae_from is not None or args.latent_channels < 1):
        parser.error("--latent-channels must be >= 1 and applies to an autoencoder trained here, not to --vae-from's")
    return {**config, "embed_dim": args.latent_channels or config["embed_dim"]}


PROBE_STEPS = 20  # timed throwaway steps behind a step count for a time budget (after 3 untimed ones)


def budgeted_steps(name: str, minutes: float | None, steps: int, model: torch.nn.Module,
                   loss_fn: Callable[[torch.nn.Module, object], tuple[torch.Tensor, torch.Tensor]],
                   batch_fn: Callable[[torch.Generator], object], work_dir: str | Path,
                   device: torch.device | str = "cpu") -> int:
    """The steps `train_loop(name, ...)` is to take: `steps`, or, with a budget of `minutes`, the number that fits in
    it — a resumed run's own count (its checkpoint's), else 95 % of the budget over the time of a step, measured on
    PROBE_STEPS throwaway steps (AdamW at learning rate 0 on a copy of `model`, batches from a generator of their
    own, so the run itself is untouched). Processes training side by side measure each other's load."""
    if minutes is None:
        return steps
    ckpt_path = checkpoint_path(work_dir, name)
    if ckpt_path.exists():
        planned = torch.load(ckpt_path, weights_only=False, map_location="cpu").get("steps")
        if planned is not None:
            return planned
    device = torch.device(device)
    probe = copy.deepcopy(model).to(device).train()
    optimizer = torch.optim.AdamW(probe.parameters(), lr=0.0)
    generator = torch.Generator().manual_seed(0)

    for _ in range(3):  # allocation, kernel choices
        update(probe, optimizer, loss_fn, batch_fn(generator), device)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(PROBE_STEPS):
        update(probe, optimizer, loss_fn, batch_fn(generator), device)
    synchronize(device)
    per_step = (time.perf_counter() - start) / PROBE_STEPS
    planned = max(1, int(0.95 * minutes * 60 / per_step))
    logger.info("%s: %.1f ms a step here: %d steps for %g minutes", name, per_step * 1e3, planned, minutes)
    return planned


def checkpoint_path(work_dir: str | Path, name: str) -> Path:
    """Where `train_loop(name, ...)` keeps its resumable checkpoint."""
    return Path(work_dir) / f"ckpt-{name}.pt"


def cosine_lr(lr: float, steps: int, warmup: int) -> Callable[[int], float]:
    """Linear warm-up over `warmup` steps, then cosine decay to 10% of `lr` at `steps`."""

    def lr_at(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    return lr_at


def total_variation(p: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """[...]: TV(p, softmax(logits)) = 1 - sum min(p, q), the rejection rate of a draft sampled from q."""
    return 1 - torch.minimum(p, logits.softmax(-1)).sum(-1)


def seconds_key(device: torch.device) -> str:
    """The training metrics' key for the training time: train_cpu_seconds, train_cuda_seconds."""
    return f"train_{device.type}_seconds"


def to_device(batch, device: torch.device):
    """`batch` (a tensor, or a tuple / list of tensors and other values) with its tensors moved to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, tuple | list):
        return type(batch)(to_device(item, device) for item in batch)
    return batch


def update(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
           loss_fn: Callable[[torch.nn.Module, object], tuple[torch.Tensor, torch.Tensor]], batch: object,
           device: torch.device) -> torch.Tensor:
    """One optimiser step on `batch` (moved to `device`; bfloat16 autocast on CUDA; grad-norm clip 1); returns the
    loss to display."""
    with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
        total, shown = loss_fn(model, to_device(batch, device))
    optimizer.zero_grad(set_to_none=True)
    total.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return shown


def train_loop(
    name: str,
    model: torch.nn.Module,
    *,
    steps: int,
    lr: float,
    loss_fn: Callable[[torch.nn.Module, object], tuple[torch.Tensor, torch.Tensor]],
    batch_fn: Callable[[torch.Generator], object],
    work_dir: str | Path,
    seed: int,
    ckpt_every: int = 100,
    weight_decay: float = 0.1,
    after_step: Callable[[int], None] | None = None,
    device: torch.device | str = "cpu",
) -> float:
    """Train `model` for `steps` AdamW steps (warm-up, cosine to 10%, grad-norm clip 1), resuming from
    `<work_dir>/ckpt-<name>.pt`, which is rewritten every `ckpt_every` steps with the model, optimiser, data RNG and
    elapsed time.

    batch_fn(generator) -> batch draws the next batch (on the CPU) from the loop's data generator (seeded by `seed`,
    restored on resume); the loop moves it to `device`, where `model` is moved too. loss_fn(model, batch) -> (loss to
    optimise, loss to display) runs under bfloat16 autocast on CUDA. after_step(step) runs after each update.
    Returns the seconds spent training in total, across resumptions.
    """
    device = torch.device(device)
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)
    lr_at = cosine_lr(lr, steps, warmup=min(100, steps // 10))
    generator = torch.Generator().manual_seed(seed)
    ckpt_path = checkpoint_path(work_dir, name)
    start, elapsed = 0, 0.0
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, weights_only=False, map_location=device)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        generator.set_state(ckpt["generator"].cpu())  # the data generator is a CPU one; map_location moved its state
        start, elapsed = ckpt["step"], ckpt["elapsed_s"]
        if start > steps:  # a longer run's checkpoint: "resuming" it would train nothing and report that run
            raise ValueError(f"{ckpt_path} holds a run at step {start}, past the {steps} steps asked for: ask for "
                             f"at least {start} steps to resume it, or train in another work folder")
        logger.info("resuming %s from step %d", name, start)

    model.train()
    t0 = time.perf_counter()
    bar = tqdm(range(start, steps), desc=f"train {name}", initial=start, total=steps)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        shown = update(model, optimizer, loss_fn, batch_fn(generator), device)
        if after_step is not None:
            after_step(step)
        if step % 10 == 0:  # reading the loss syncs with the device
            bar.set_postfix(loss=f"{shown.item():.4f}")
        done = step + 1
        if done % ckpt_every == 0 or done == steps:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "generator": generator.get_state(), "step": done, "steps": steps,
                     "elapsed_s": elapsed + time.perf_counter() - t0}
            torch.save(state, ckpt_path)
    model.eval()
    return elapsed + time.perf_counter() - t0


def save_stage(model, folder: Path, metrics: dict, steps: int, batch_size: int, seconds: float) -> dict:
    """Complete a training stage: add the model's size and the run (steps, batch size, training seconds on the model's
    device) to its held-out `metrics`, log them, and save the model with `training_metrics.json` in `folder`. Returns
    the metrics."""
    metrics = {**metrics, "parameters": sum(p.numel() for p in model.parameters()), "steps": steps,
               "batch_size": batch_size, seconds_key(next(model.parameters()).device): round(seconds, 1)}
    logger.info("%s: %s", folder.name, metrics)
    model.save_pretrained(folder)
    (folder / "training_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def index_entry(cls: type) -> list[str]:
    """`cls` as a saved pipeline's model_index.json names a component: [its top-level package, its name] —
    ["mmspec", "MARModel"], the form mmspec's pipelines save and load."""
    return [cls.__module__.split(".")[0], cls.__name__]


def copy_stage(pipeline_dir: Path, component: str, cls, metrics_key: str, folder: Path) -> None:
    """Stage a component from a saved pipeline instead of training it: `<pipeline_dir>/<component>` (as `cls`, in
    float32) saved to `folder` with its metrics from the pipeline's training_metrics.json (under `metrics_key`), so
    that a retrained model keeps the shipped tokenizer or autoencoder."""
    model = cls.from_pretrained(pipeline_dir / component).float()
    metrics = json.loads((pipeline_dir / "training_metrics.json").read_text())[metrics_key]
    if folder.exists():
        shutil.rmtree(folder)
    model.save_pretrained(folder)
    (folder / "training_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    logger.info("%s: taken from %s", folder.name, pipeline_dir)


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace, positive: tuple[str, ...],
                    models: tuple[str, ...]) -> None:
    """A training command's checks before any model loads: the `positive` arguments (dest names) are >= 1 and the
    `models` arguments name a zoo model or a local folder (else the parser exits 2 naming the flag); then logging
    to the console."""
    from mmspec.zoo import resolve_model

    for name in positive:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in models:
        try:
            resolve_model(getattr(args, name), f"--{name}")
        except ValueError as error:
            parser.error(str(error))
    logging.basicConfig(level=logging.INFO, format="%(message)s")
