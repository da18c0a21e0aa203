"""Text drafters. Each returns a `mmspec.core.drafts.Draft`, which carries the exact law each of its tokens was
sampled from (DESIGN.md §2.2).

Drafters (any transformers causal LM as a small model, self-speculative early exit, n-gram prompt lookup) all return a
`Draft`; draft-length schedules (constant, HF's +2/-1 heuristic) and the confidence stop (HF's
`assistant_confidence_threshold`, DISCO arXiv 2405.04304, without the online re-fit) decide how many tokens each row
drafts. Sequence buffers passed to drafters are left-aligned: row b is `tokens[b, :lengths[b]]`.
"""

from __future__ import annotations

import copy
from typing import Protocol

import torch

from mmspec.core.drafts import Draft
from mmspec.core.probs import SamplingConfig, process_logits
from mmspec.core.rng import Generators, sample
from mmspec.options import SCHEDULES
from mmspec.text.cache import RaggedCacheState, forward_window, select_rows, truncate


class Drafter(Protocol):
    """What `speculative_generate` asks of a drafter."""

    vocab_size: int | None  # None: works with any vocabulary (n-gram)
    forwards: int  # model calls so far (SpecStats.draft_forwards)

    def reset(self, batch_size: int, device: torch.device) -> None:
        """Forget the previous batch."""

    def propose(
        self, tokens: torch.Tensor, lengths: torch.Tensor, budget: torch.Tensor, sampling: SamplingConfig, generator: Generators
    ) -> Draft:
        """Draft up to `budget[b]` tokens after `tokens[b, :lengths[b]]` (tokens: [B, T], lengths, budget: [B])."""

    def rollback(self, keep: torch.Tensor) -> None:
        """Only the first `keep[b]` tokens of row b are still part of its sequence."""

    def select(self, index: torch.Tensor) -> None:
        """Keep only batch rows `index` ([B'] long), in that order: finished rows left the batch."""


class ModelDrafter:
    """Drafts autoregressively with a causal LM that shares the target's tokenizer, sampling from processed q.

    model: any transformers causal LM (or an `early_exit_view` of the target).
    confidence_threshold: a row stops drafting after a token whose draft probability is below it (0 = never).
    """

    def __init__(self, model, confidence_threshold: float = 0.0):
        if not 0 <= confidence_threshold < 1:
            raise ValueError(f"confidence_threshold must be in [0, 1), got {confidence_threshold}")
        self.model = model
        self.vocab_size = model.config.vocab_size
        self.confidence_threshold = confidence_threshold
        self.state: RaggedCacheState | None = None
        self.forwards = 0

    def reset(self, batch_size: int, device: torch.device) -> None:
        self.state = RaggedCacheState.empty(batch_size, device)

    def _catch_up(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Feed every row the tokens its cache lacks (right-aligned in one window). Returns last logits [B, V]."""
        missing = lengths - self.state.lengths
        W = int(missing.max())  # host sync: the window width; 1 or 2 in steady state, the prompt on the first call
        index = lengths[:, None] - W + torch.arange(W, device=tokens.device)  # [B, W]
        valid = index >= self.state.lengths[:, None]
        window = tokens.gather(1, index.clamp(min=0))
        self.forwards += 1
        return forward_window(self.model, self.state, window, valid)[:, -1]

    @torch.no_grad()
    def propose(self, tokens, lengths, budget, sampling, generator) -> Draft:
        L = int(budget.max())  # host sync: number of draft steps
        logits = self._catch_up(tokens, lengths)
        drafted, laws = [], []
        stop_at = budget.clone()  # per-row draft length
        for j in range(L):
            if j > 0:
                self.forwards += 1
                logits = forward_window(self.model, self.state, drafted[-1][:, None])[:, 0]
            q = process_logits(logits, sampling)  # [B, V]
            token = sample(q, generator)
            drafted.append(token)
            laws.append(q)
            if self.confidence_threshold > 0:
                unsure = q.gather(1, token[:, None]).squeeze(1) < self.confidence_threshold
                stop_at = torch.where(unsure & (stop_at > j + 1), torch.full_like(stop_at, j + 1), stop_at)
                if bool((stop_at <= j + 1).all()):  # host sync, adaptive mode only: every row has stopped
                    break
        return Draft(tokens=torch.stack(drafted, 1), lengths=stop_at.clamp(max=len(drafted)), q=torch.stack(laws, 1))

    def rollback(self, keep: torch.Tensor) -> None:
        truncate(self.state, keep)

    def select(self, index: torch.Tensor) -> None:
        select_rows(self.state, index)


def early_exit_view(model, exit_layer: int):
    """The first `exit_layer` layers of a transformers decoder LM plus its final norm and head, sharing all weights.

    Works for models whose backbone is `model.model` and runs `layers[: config.num_hidden_layers]` (Llama, Mistral,
    Qwen2, ... in transformers 5). The view has its own config, so it gets its own (shallower) cache.
    """
    n_layers = model.config.num_hidden_layers
    if isinstance(exit_layer, bool) or not isinstance(exit_layer, int) or not 1 <= exit_layer < n_layers:
        raise ValueError(f"exit_layer must be an int in [1, {n_layers - 1}] for a {n_layers}-layer model, got {exit_layer!r}")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = exit_layer
    backbone = copy.copy(model.model)
    backbone.config = config
    view = copy.copy(model)
    # copy.copy shares the module and hook dicts with the target: the view needs its own (hooks on the target, such
    # as forward counters, must not fire for draft calls).
    for name, value in vars(model).items():
        if name == "_modules" or name.endswith("hooks") or "_hooks_" in name:
            setattr(view, name, type(value)(value) if name == "_modules" else type(value)())
    view._modules["model"] = backbone
    view.config = config
    return view


class LayerSkipDrafter(ModelDrafter):
    """Self-speculative drafting (LayerSkip / HF `assistant_early_exit`): the target's first `exit_layer` layers."""

    def __init__(self, target, exit_layer: int, confidence_threshold: float = 0.0):
        super().__init__(early_exit_view(target, exit_layer), confidence_threshold)


class NGramDrafter:
    """Prompt lookup (Saxena 2023; HF `prompt_lookup_num_tokens`): copy what followed the latest earlier occurrence of
    the row's last n tokens, trying n = max_ngram down to min_ngram. Deterministic: `Draft.q` is None.
    """

    vocab_size = None

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.forwards = 0

    def reset(self, batch_size: int, device: torch.device) -> None:
        pass

    def rollback(self, keep: torch.Tensor) -> None:
        pass

    def select(self, index: torch.Tensor) -> None:
        pass

    @torch.no_grad()
    def propose(self, tokens, lengths, budget, sampling, generator) -> Draft:
        B, T = tokens.shape
        L = int(budget.max())  # host sync: draft width
        arange_T = torch.arange(T, device=tokens.device)
        start = torch.full((B,), -1, dtype=torch.long, device=tokens.device)  # where the copied continuation starts
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if T < n + 1:
                continue
            suffix = tokens.gather(1, (lengths[:, None] - n + torch.arange(n, device=tokens.device)).clamp(min=0))
            windows = tokens.unfold(1, n, 1)  # [B, T - n + 1, n]
            match = (windows == suffix[:, None, :]).all(-1)
            # A match must end before the suffix itself, so at least one continuation token exists.
            match &= (arange_T[: T - n + 1] + n < lengths[:, None]) & (lengths[:, None] >= n)
            latest = torch.where(match, arange_T[: T - n + 1], -1).max(-1).values
            found = (start < 0) & (latest >= 0)
            start = torch.where(found, latest + n, start)
        index = (start[:, None] + torch.arange(L, device=tokens.device)).clamp(0, T - 1)
        available = torch.where(start >= 0, lengths - start, 0)
        return Draft(tokens=tokens.gather(1, index), lengths=torch.minimum(available, budget).clamp(min=0))


class DraftLengthSchedule:
    """Per-row draft budgets. "constant": always `length`. "heuristic" (HF `num_assistant_tokens_schedule`): +2 after a
    fully accepted draft, else -1, never below 1 or above `max_length`. budget: [B] long after `reset`.
    """

    def __init__(self, length: int = 4, kind: str = "constant", max_length: int = 16):
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"draft length must be an int >= 1, got {length!r}")
        if kind not in SCHEDULES:
            raise ValueError(f"draft length schedule must be one of {SCHEDULES}, got {kind!r}")
        self.length, self.kind = length, kind
        self.max_length = length if kind == "constant" else max(max_length, length)
        self.budget: torch.Tensor | None = None

    def reset(self, batch_size: int, device: torch.device) -> None:
        self.budget = torch.full((batch_size,), self.length, dtype=torch.long, device=device)

    def select(self, index: torch.Tensor) -> None:
        self.budget = self.budget[index]

    def update(self, n_accepted: torch.Tensor, draft_lengths: torch.Tensor) -> None:
        if self.kind == "heuristic":
            full = (n_accepted == draft_lengths) & (draft_lengths > 0)
            self.budget = torch.where(full, self.budget + 2, self.budget - 1).clamp(1, self.max_length)
