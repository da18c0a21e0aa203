"""Sorted multiple exits (S2D, Kavehzadeh et al. 2024, arXiv 2407.01955) on Kangaroo's exit adapter: one adapter trained
at several exits l_1 < ... < l_k of the target at once (`KangarooAdapter(exit_layers=...)`, sorted fine-tuning:
`python -m mmspec.zoo.train_kangaroo --exit-layer 3 --exit-layers 2 3 4 6`) makes k nested drafts, the target's first
l_j layers then the adapter, and each row drafts a step's chain through the exit it chooses for that step.

`mmspec.adapters.nested_exits.NestedExits` runs them on one cache; each row takes, step by step, the first exit
whose top-1 probability for the step's first draft token (its temperature-1 law) reaches `exit_threshold`, the
deepest if none does, and the batch drafts the rest of the chain through every level, each row reading its own
exit; each token's law is recorded as it is drawn, so verification is exact.
"""

from __future__ import annotations

import torch

from mmspec.adapters.nested_exits import NestedExits
from mmspec.core.drafting.proposer import stop_after
from mmspec.core.drafts import Draft
from mmspec.core.probs import one_hot, process_logits
from mmspec.core.rng import inverse_cdf, uniform
from mmspec.text.drafters import ChainDrafter, confidence_stop, exits_of, key_of


class SortedExitDrafter(ChainDrafter):
    """S2D's drafter (see the module docstring): the nested drafts of a sorted Kangaroo adapter (`adapter`, trained
    at two exits or more) over `target`, one exit per row and step.

    exit_threshold: a row drafts the step through the shallowest exit whose top-1 probability for the step's first
    token reaches it (the deepest if none does). confidence_threshold: Kangaroo's double early exit within the
    chain (0 = never). `exits_taken` [k] counts the rows' choices over the drafter's steps. A step runs every level,
    each row reading its own exit's output: one shape whatever the rows choose (no host read; a captured step holds
    it)."""

    # slots each level re-reads before a row's end: a step feeds every draft but the last through every level, so of
    # what it commits only the last draft and the closing token lack their states
    catch_up_width = 2

    def __init__(self, target, adapter, exit_threshold: float = 0.3, confidence_threshold: float = 0.0):
        if not 0 < exit_threshold <= 1:
            raise ValueError(f"exit_threshold must be in (0, 1], got {exit_threshold}")
        self.stop = confidence_stop(confidence_threshold)
        model = exits_of(target, "SortedExitDrafter")
        self.nested = NestedExits(model, adapter)
        if len(self.nested.exit_layers) < 2:
            raise ValueError(f"sorted exits need an adapter trained at two exits or more (exit_layers), this one has "
                             f"{list(self.nested.exit_layers)}: train one with python -m mmspec.zoo.train_kangaroo "
                             f"--exit-layers ...")
        self.exit_threshold, self.vocab_size = exit_threshold, model.vocab_size
        self.exits_taken = torch.zeros(len(self.nested.exit_layers), dtype=torch.long)
        self.forwards = 0

    def capture_key(self) -> tuple:
        nested = self.nested
        return (type(self), self.exit_threshold, key_of("stop", self.stop), nested.exit_layers,
                key_of("adapter", nested.norm), key_of("target", nested.embed))

    def start(self, rows, vocab_size, capacity) -> None:
        self.state = self.nested.prefill(rows.prompt, capacity)
        self.exits_taken = self.exits_taken.to(rows.tokens.device)

    def select(self, index: torch.Tensor) -> None:
        self.state.select(index)

    @torch.no_grad()
    def propose(self, rows, budget, width, sampling, generator) -> Draft:
        B, device = rows.batch_size, rows.tokens.device
        end = rows.offsets + rows.committed  # [B] each row's next slot (slot = position)
        self.forwards += 1
        exit_index, logits = self._choose(rows.tokens, end)  # [B], [B, 1, V]
        self.exits_taken += one_hot(exit_index, len(self.exits_taken), torch.long).sum(0)
        row_exit = exit_index[:, None, None]
        drafts, laws, draws = [], [], None
        stop_at = budget.clone()
        if self.stop is not None:
            self.stop.start(B, device)
        for i in range(width):
            q = process_logits(logits, sampling)  # [B, 1, V]
            if draws is None:
                draws = uniform((B, width), generator, device, q.dtype)
            tokens = inverse_cdf(q, draws[:, i : i + 1])
            drafts.append(tokens)
            laws.append(q)
            if i == width - 1:
                break
            if self.stop is not None:
                stop_at = stop_after(stop_at, self.stop(i, logits, q, tokens, sampling), i)
            self.forwards += 1  # the draft through every level, for the next token's law at each row's exit
            features = self.nested.step(tokens, (end + i)[:, None], self.state)  # [B, k, d]
            logits = self.nested.head(features.gather(1, row_exit.expand(-1, 1, features.shape[-1])))
        return Draft(torch.cat(drafts, 1), stop_at, torch.cat(laws, 1))

    def _choose(self, tokens: torch.Tensor, end: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's exit for the step ([B] long) and its logits for the step's first draft token [B, 1, V]: every
        level catches up to the row's tokens (`tokens` [B, S], slots before end [B]), shallowest first; a row takes
        the first exit whose top-1 probability (temperature 1) reaches `exit_threshold`, else the deepest."""
        last = len(self.nested.exit_layers) - 1
        choice = torch.full_like(end, last)
        undecided, logits = torch.ones_like(end, dtype=torch.bool), None
        for level in range(last + 1):
            scores = self.nested.head(self.nested.catch_up(level, tokens, end, self.state, self.catch_up_width))
            logits = scores if logits is None else torch.where(undecided[:, None], scores, logits)
            confident = scores.float().softmax(-1).amax(-1) >= self.exit_threshold
            choice = torch.where(undecided & confident & (level < last), level, choice)
            undecided &= ~confident
        return choice, logits[:, None]
