"""Sorted multiple exits (S2D, Kavehzadeh et al. 2024, arXiv 2407.01955) on Kangaroo's exit adapter: one adapter trained
at several exits l_1 < ... < l_k of the target at once (`KangarooAdapter(exit_layers=...)`, sorted fine-tuning:
`python -m mmspec.zoo.train_kangaroo --exit-layer 3 --exit-layers 2 3 4 6`) makes k nested drafts, the target's first
l_j layers then the adapter, and each row drafts a step's chain through the exit it chooses for that step.

`mmspec.adapters.nested_exits.NestedExits` runs them on one cache; each row takes, step by step, the first exit
whose top-1 probability for the step's first draft token (its temperature-1 law) reaches `exit_threshold`, the
deepest if none does, and the batch drafts the rest of the chain through the layers of the deepest exit a row took,
each row reading its own exit; each token's law is recorded as it is drawn, so verification is exact.
"""

from __future__ import annotations

import torch

from mmspec.adapters.nested_exits import NestedExits
from mmspec.core.drafting.proposer import stop_after
from mmspec.core.drafts import Draft
from mmspec.core.probs import process_logits
from mmspec.core.rng import inverse_cdf, uniform
from mmspec.text.drafters import ChainDrafter, confidence_stop, exits_of


class SortedExitDrafter(ChainDrafter):
    """S2D's drafter (see the module docstring): the nested drafts of a sorted Kangaroo adapter (`adapter`, trained
    at two exits or more) over `target`, one exit per row and step.

    exit_threshold: a row drafts the step through the shallowest exit whose top-1 probability for the step's first
    token reaches it (the deepest if none does). confidence_threshold: Kangaroo's double early exit within the
    chain (0 = never). `exits_taken` [k] counts the rows' choices over the drafter's steps."""

    capturable = False  # the exits taken are read on the host every step

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

    def start(self, rows, vocab_size, capacity) -> None:
        self.state = self.nested.prefill(rows.prompt, capacity)

    def select(self, index: torch.Tensor) -> None:
        self.state.select(index)

    @torch.no_grad()
    def propose(self, rows, budget, width, sampling, generator) -> Draft:
        B, device = rows.batch_size, rows.tokens.device
        end = rows.offsets + rows.committed  # [B] each row's next slot (slot = position)
        self.forwards += 1
        exit_index, logits = self._choose(rows.tokens, end)  # [B], [B, 1, V]
        taken = exit_index.tolist()  # host read: which exits (and layers) the chain runs
        used = sorted(set(taken))
        self.exits_taken += torch.bincount(torch.tensor(taken), minlength=len(self.exits_taken))
        column = torch.tensor([used.index(j) if j in used else 0 for j in range(len(self.exits_taken))],
                              device=device)
        row_column = column[exit_index][:, None, None]  # each row's exit among those the chain runs
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
                if bool((stop_at <= i + 1).all()):  # host read: every row has stopped
                    break
            self.forwards += 1  # the draft through the levels of the deepest exit taken, for the next one's law
            outputs = self.nested.step(tokens, (end + i)[:, None], self.state, used[-1] + 1, set(used))
            features = torch.stack([outputs[j] for j in used], 1)  # [B, len(used), d]
            logits = self.nested.head(features.gather(1, row_column.expand(-1, 1, features.shape[-1])))
        return Draft(torch.cat(drafts, 1), stop_at.clamp(max=len(drafts)), torch.cat(laws, 1))

    def _choose(self, tokens: torch.Tensor, end: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's exit for the step ([B] long) and its logits for the step's first draft token [B, 1, V]: the
        levels catch up to the row's tokens (`tokens` [B, >= max(end)], slots before end [B]) one by one, shallowest
        first, while a row is undecided (one host read per level); a row takes the first exit whose top-1 probability
        (temperature 1) reaches `exit_threshold`, else the deepest."""
        last = len(self.nested.exit_layers) - 1
        choice = torch.full_like(end, last)
        undecided, logits = torch.ones_like(end, dtype=torch.bool), None
        for level in range(last + 1):
            scores = self.nested.head(self.nested.catch_up(level, tokens, end, self.state))  # [B, V]
            logits = scores if logits is None else torch.where(undecided[:, None], scores, logits)
            if level == last:
                break
            confident = scores.float().softmax(-1).amax(-1) >= self.exit_threshold
            choice = torch.where(undecided & confident, level, choice)
            undecided &= ~confident
            if not bool(undecided.any()):
                break
        return choice, logits[:, None]
