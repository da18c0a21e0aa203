"""Memory of SJD's decoding state at Emu3 scale: what a running `mmspec.image.SJD` holds between target forwards.

    python -m mmspec.eval.sjd_memory --json eval/results/sjd_memory.json

A random low-rank bigram model (`BigramImageModel`: an image adapter whose logits depend on the last token only,
stateless, so no KV cache enters the figure) with N = 8,192 image tokens (64 x 128) and V = 32,768 ids is decoded
by SJD at window L = 32, batch 2, with each coupling, for a few target forwards. After each forward the decoding's
frame is walked: every tensor it references (locals, and the tensors of the objects it keeps: committed tokens, draft
span, stats), counted once per storage, except the model's and the caller's arguments. The largest total over
the forwards and couplings is `sjd_state_bytes`. An O(N V) state (laws and Gumbel vectors for every position) is
about 2.2 GB per buffer here; a state kept for the live window only is O(L V).
"""

from __future__ import annotations

import argparse
import json
from contextlib import closing
from pathlib import Path

import torch

from mmspec.core.model import Logits
from mmspec.core.probs import SamplingConfig
from mmspec.core.stats import SpecStats
from mmspec.image import COUPLINGS, SJD

ARGUMENTS = {"self", "model", "condition", "sampling", "generator"}  # the caller's, not the decoding's


class BigramImageModel:
    """A random image AR model whose next-token logits are a low-rank function of the last token: [V, r] @ [r, V].
    Satisfies `mmspec.image.DiscreteImageModel`; its state is nothing (there is no cache to keep or roll back)."""

    capabilities = frozenset()

    def __init__(self, grid: tuple[int, int], vocab_size: int, rank: int = 8, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.grid, self.vocab_size = grid, vocab_size
        self.embed = torch.randn(vocab_size, rank, generator=g)
        self.head = torch.randn(rank, vocab_size, generator=g)
        self.start = torch.randn(rank, generator=g)

    def prefill(self, condition: torch.Tensor, cfg: bool, max_window: int = 1):
        """condition: [B] long, one seed token per sample (its embedding starts the chain)."""
        logits = (self.embed[condition] + self.start)[:, None] @ self.head
        return None, Logits(logits, logits if cfg else None)

    def forward(self, tokens: torch.Tensor, state) -> Logits:
        return Logits(self.embed[tokens] @ self.head)

    def rollback(self, state, keep: torch.Tensor) -> None:
        pass

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("a memory probe: its tokens are not an image")


def tensors_held(value, seen: set[int], depth: int = 0) -> int:
    """Bytes of the tensors `value` references (itself, or inside containers / objects), each storage once."""
    if isinstance(value, torch.Tensor):
        key = value.untyped_storage().data_ptr()
        if key in seen or value.device.type == "meta":
            return 0
        seen.add(key)
        return value.untyped_storage().nbytes()
    if depth > 2:
        return 0
    if isinstance(value, dict):
        return sum(tensors_held(v, seen, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensors_held(v, seen, depth + 1) for v in value)
    if type(value).__module__.startswith("mmspec") and hasattr(value, "__dict__"):
        return sum(tensors_held(v, seen, depth + 1) for v in vars(value).values())
    return 0


def state_bytes(frame, exclude: set[int]) -> int:
    """Bytes of the tensors a suspended decoding's frame holds, without those in `exclude` (storage pointers)."""
    seen = set(exclude)
    return sum(tensors_held(v, seen) for k, v in frame.f_locals.items() if k not in ARGUMENTS)


def innermost_frame(generator):
    """The frame of the decoding's own generator (`torch.no_grad` wraps a generator function in another one)."""
    frame = generator.gi_frame
    while frame is not None and hasattr(frame.f_locals.get("gen"), "gi_frame"):
        frame = frame.f_locals["gen"].gi_frame
    return frame


def measure(coupling: str, grid: tuple[int, int], vocab_size: int, window: int, batch_size: int, forwards: int) -> int:
    """The largest state, in bytes, over the first `forwards` target forwards of one SJD decoding."""
    model = BigramImageModel(grid, vocab_size)
    model_storages = {t.untyped_storage().data_ptr() for t in (model.embed, model.head, model.start)}
    decoding = SJD(window=window, coupling=coupling)
    steps = decoding.run(model, torch.arange(batch_size), SamplingConfig(top_k=0, guidance_scale=1.0),
                     torch.Generator().manual_seed(0), SpecStats())
    largest = 0
    with torch.no_grad(), closing(steps):
        for i, _ in enumerate(steps):
            largest = max(largest, state_bytes(innermost_frame(steps), model_storages))
            if i == forwards:
                break
    return largest


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--height", type=int, default=64, help="image grid rows (N = height x width tokens)")
    parser.add_argument("--width", type=int, default=128, help="image grid columns")
    parser.add_argument("--vocab-size", type=int, default=32768, help="V, image-token ids")
    parser.add_argument("--window", type=int, default=32, help="L, tokens scored per target forward")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--forwards", type=int, default=4, help="target forwards observed per coupling")
    parser.add_argument("--json", default=None, help="write the figures to this path")
    args = parser.parse_args(argv)
    for name in ("height", "width", "vocab_size", "window", "batch_size", "forwards"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    grid = (args.height, args.width)
    per_coupling = {coupling: measure(coupling, grid, args.vocab_size, args.window, args.batch_size, args.forwards)
                    for coupling in COUPLINGS}
    result = {"N": grid[0] * grid[1], "V": args.vocab_size, "L": args.window, "batch_size": args.batch_size,
              "state_bytes_per_coupling": per_coupling, "sjd_state_bytes": max(per_coupling.values())}
    for coupling, size in per_coupling.items():
        print(f"coupling={coupling:<8} state {size / 2**20:9.1f} MiB")
    print(f"sjd_state_bytes {result['sjd_state_bytes']} ({result['sjd_state_bytes'] / 2**20:.1f} MiB)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
