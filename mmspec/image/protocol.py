"""What a discrete image AR decoder may ask of a model (DESIGN.md §3). Decoders never import a model family.

A model adapter holds the generation state outside the `nn.Module`: `prefill` returns it, `forward` appends a window of
tokens to it, `rollback` truncates it per row. With classifier-free guidance the adapter runs the conditional and the
unconditional rows of each sample in lockstep and returns both logits; they are combined by
`mmspec.core.process_logits` (the one probability function), never by the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass(frozen=True)
class ImageLogits:
    """cond: [B, W, V] float32 conditional logits; uncond: [B, W, V] unconditional logits, or None without CFG."""

    cond: torch.Tensor
    uncond: torch.Tensor | None = None

    @classmethod
    def from_rows(cls, logits: torch.Tensor, batch_size: int, cfg: bool) -> ImageLogits:
        """Split logits [B or 2B, W, V] of a batch run with CFG as rows [0, B) conditional, [B, 2B) unconditional."""
        return cls(logits[:batch_size], logits[batch_size:]) if cfg else cls(logits)

    def at(self, index: int | slice) -> ImageLogits:
        """The logits of window position(s) `index` (an int drops the window dim: [B, V])."""
        return ImageLogits(self.cond[:, index], None if self.uncond is None else self.uncond[:, index])


class DiscreteImageModel(Protocol):
    """Adapter protocol of a discrete-token AR image model.

    The image span: `grid` (h, w), its N = h * w tokens in raster order, and `vocab_size` V (image-token ids
    0..V-1). An adapter may also expose `forced_tokens`: [N] long, the token every sample has at a position (e.g. an
    end-of-line column) or -1 where the position is free; decoders then treat those positions as one-hot laws.
    """

    grid: tuple[int, int]
    vocab_size: int

    def prefill(self, condition: Any, cfg: bool, max_window: int = 1) -> tuple[Any, ImageLogits]:
        """Run the condition prefix of B samples (with their unconditional rows when `cfg`); returns the state and the
        logits [B, 1, V] of image token 0. `max_window`: the widest window `forward` will get; the state keeps room
        for a window that starts at any row's last image token."""

    def forward(self, tokens: torch.Tensor, state: Any) -> ImageLogits:
        """Append tokens [B, W] after each row's kept tokens; logits [B, W, V], position w predicting the token after
        tokens[:, w]."""

    def rollback(self, state: Any, keep: torch.Tensor) -> None:
        """Keep the first keep[b] image tokens of row b in the state (keep: [B] long)."""

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, h*w] -> images [B, 3, H, W], roughly in [-1, 1]."""

    # Optional, for tree drafts (SJD's frontier trees, `mmspec.image.frontier`; the draft model's trees,
    # `DraftModel(tree_width=K)`); LlamaGen's adapter has them:
    #   forward_tree(tokens [B, T], offset [T] or [B, T], visible [T, P + T] or [B, T, P + T], state) ->
    #       ImageLogits [B, T, V]: append T tree nodes after the P nodes the tree's earlier forward_tree calls
    #       appended (P = 0 starts a tree at the kept tokens; a tree may grow over several calls). Node t sits at
    #       position start + offset[t], start = the tree's first slot (the kept tokens when it began), and attends
    #       to the kept tokens before the tree and to the tree's nodes where visible[t] is True (its ancestors and
    #       itself, earlier calls' nodes first).
    #   keep_path(state, path [B, depth]): after forward_tree, move the keys/values of the path's nodes (the tree
    #       node of levels 1 .. depth, counted from the tree's first slot, -1 past the path) onto the slots
    #       start + 1 .. start + depth, so that a rollback keeps exactly the accepted path.
    # Optional, for PJD's row windows (`mmspec.image.parallel`); LlamaGen's adapter has them:
    #   forward_segments(tokens [B, T], positions [B, T], segments [B, T], state) -> ImageLogits [B, T, V]: score
    #       tokens at scattered image positions; token t sees the committed tokens before its position and the
    #       tokens of its segment up to itself. The state's kept lengths are not used.
    #   commit_segments(state, keep [B, T] bool): after forward_segments, keep the kept tokens' keys/values at their
    #       positions, where later segment tokens see them.


TREE_METHODS = ("forward_tree", "keep_path")  # what tree drafts ask of an adapter
SEGMENT_METHODS = ("forward_segments", "commit_segments")  # what PJD asks of an adapter


def missing_methods(model: DiscreteImageModel, names: tuple[str, ...]) -> list[str]:
    """The optional adapter methods of `names` that `model` does not have."""
    return [name for name in names if not callable(getattr(model, name, None))]


def require_methods(model: DiscreteImageModel, names: tuple[str, ...], what: str) -> None:
    """Raise a ValueError naming `what` unless the adapter has every method of `names`."""
    missing = missing_methods(model, names)
    if missing:
        raise ValueError(f"{what} needs a model adapter with {' and '.join(names)}; {type(model).__name__} has no "
                         f"{' or '.join(missing)}")
