"""The one causal-model protocol every decoder drives, text and image alike. Decoders never import a model family:
they hold a `CausalModel` and its state, which lives outside the `nn.Module` (the object `prefill` returns).

    prefill(prompt, cfg, max_window) -> (state, logits [B, 1, V])  the prompt; logits for the first token after it
    forward(tokens [B, W], state) -> logits [B, W, V]              append a window after each row's kept tokens
    rollback(state, keep [B])                                      keep the first keep[b] tokens after the prompt
    select_rows(state, index [B'])                                 keep batch rows `index` (finished rows leave)
    capabilities                                                   what else it does, of CAPABILITIES:
      "tree":     forward_tree(tokens [B, T], offset, visible, state) -> logits [B, T, V]; keep_path(state, path)
      "segments": forward_segments(tokens, positions, segments, state) -> logits; commit_segments(state, keep)
      "features": feature_readout() -> (embedding, LM head); feature_layers() -> decoder layers (a feature head's)
      "exits":    exit_model(exit_layer, adapter) -> an early-exit LM sharing the weights (LayerSkip, Kangaroo)

"Tokens after the prompt" count what a decoder appended: the image tokens of an image model, the last prompt token and
the new tokens of a text model (whose prefill holds the prompt but its last token, which opens the first window).
With classifier-free guidance (`cfg`) a model runs the unconditional rows of every sample in lockstep and returns both
logits unmixed (`Logits`); they are combined by `mmspec.core.probs.process_logits`, the one probability function.

Implementations: `mmspec.adapters.CausalLMAdapter` for every transformers causal LM (text targets and drafters, and
the transformers image families on top of it), `mmspec.models.llamagen.adapter.LlamaGenAdapter` for LlamaGen's own
GPT. A new family is one adapter file. This module loads without torch (components check capabilities with it before
torch loads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

CAPABILITIES = {
    "tree": ("forward_tree", "keep_path"),  # tree attention over draft nodes, then keep the accepted path
    "segments": ("forward_segments", "commit_segments"),  # scattered windows that see the committed tokens only
    "features": ("feature_readout", "feature_layers"),  # what a feature head reads: the LM head's input, layers
    "exits": ("exit_model",),  # self-speculative drafts: the first layers (and an exit adapter)
}


@dataclass(frozen=True)
class Logits:
    """cond: [B, W, V] float32 conditional logits; uncond: [B, W, V] unconditional logits, or None without CFG."""

    cond: torch.Tensor
    uncond: torch.Tensor | None = None

    @classmethod
    def from_rows(cls, logits: torch.Tensor, batch_size: int, cfg: bool) -> Logits:
        """Split logits [B or 2B, W, V] of a batch run with CFG as rows [0, B) conditional, [B, 2B) unconditional."""
        return cls(logits[:batch_size], logits[batch_size:]) if cfg else cls(logits)

    def at(self, index: int | slice) -> Logits:
        """The logits of window position(s) `index` (an int drops the window dim: [B, V])."""
        return Logits(self.cond[:, index], None if self.uncond is None else self.uncond[:, index])

    def gather(self, index: torch.Tensor) -> Logits:
        """The logits at window positions `index` [B, W'] of each row: [B, W', V]."""
        def take(x):
            return None if x is None else x.gather(1, index[..., None].expand(-1, -1, x.shape[-1]))

        return Logits(take(self.cond), take(self.uncond))


class CausalModel(Protocol):
    """See the module docstring. vocab_size: the ids the logits range over."""

    vocab_size: int
    capabilities: frozenset[str]

    def prefill(self, prompt: Any, cfg: bool = False, max_window: int = 1) -> tuple[Any, Logits]:
        """Run the prompt of B samples (with their unconditional rows when `cfg`); returns the state, with no token
        after the prompt, and the logits [B, 1, V] of the first one. `max_window`: the widest window `forward` or
        `forward_tree` will get; the state keeps room for it."""

    def forward(self, tokens: torch.Tensor, state: Any) -> Logits:
        """Append tokens [B, W] after each row's kept tokens; logits [B, W, V], position w predicting the token after
        tokens[:, w]."""

    def rollback(self, state: Any, keep: torch.Tensor) -> None:
        """Keep the first keep[b] tokens after row b's prompt (keep: [B] long); the rest are forgotten."""

    def select_rows(self, state: Any, index: torch.Tensor) -> None:
        """Keep only the batch rows `index` ([B'] long), in that order."""

    # "tree":
    #   forward_tree(tokens [B, T], offset [T] or [B, T], visible [T, P + T] or [B, T, P + T], state) -> Logits
    #       [B, T, V]: append T tree nodes after the P nodes the tree's earlier forward_tree calls appended (P = 0
    #       starts a tree at the kept tokens; a tree may grow over several calls). Node t sits at position start +
    #       offset[t], start = the tree's first slot (the kept tokens when it began), and attends to the kept tokens
    #       before the tree and to the tree's nodes where visible[t] is True (its ancestors and itself, earlier calls'
    #       nodes first).
    #   keep_path(state, path [B, depth]): after forward_tree, move the keys/values of the path's nodes (the tree
    #       node of levels 1 .. depth, counted from the tree's first slot, -1 past the path) onto the slots
    #       start + 1 .. start + depth, so that a rollback keeps exactly the accepted path.
    # "segments" (parallel windows over image rows):
    #   forward_segments(tokens [B, T], positions [B, T], segments [B, T], state) -> Logits [B, T, V]: score
    #       tokens at scattered positions; token t sees the committed tokens before its position and the tokens of
    #       its segment up to itself. The state's kept lengths are not used.
    #   commit_segments(state, keep [B, T] bool): after forward_segments, keep the kept tokens' keys/values at their
    #       positions, where later segment tokens see them.
    # "features" (draft heads on the target's features, `mmspec.core.drafting.heads`):
    #   feature_readout() -> (embedding, lm_head): the modules that embed the adapter's token ids and turn the
    #       target's features (its LM head's input, which every forward feeds it) into logits over them.
    #   feature_layers() -> the target's decoder layers in order, whose outputs (their last columns aligned with
    #       the LM head's input) an EAGLE-3 head fuses with the feature.


def require(model: Any, capabilities: frozenset[str] | set[str], what: str) -> None:
    """Raise a ValueError naming `what` unless `model` declares every one of `capabilities` and has their methods."""
    declared = getattr(model, "capabilities", frozenset())
    for capability in sorted(capabilities):
        methods = CAPABILITIES[capability]
        missing = [m for m in methods if not callable(getattr(model, m, None))]
        if capability not in declared or missing:
            raise ValueError(f"{what} needs a model adapter with {' and '.join(methods)} (capability "
                             f"{capability!r}); {type(model).__name__} has no {' or '.join(missing or methods)}")
