"""How many tokens each row drafts per round (`mmspec.core.speculation.Chain`): a constant length, or HF's heuristic
schedule that lengthens a row's drafts after each fully accepted one."""

from __future__ import annotations

import torch

from mmspec.core.kinds import SCHEDULES


class DraftLengthSchedule:
    """Per-row draft budgets. "constant": always `length`. "heuristic" (HF `num_assistant_tokens_schedule`): +2 after a
    fully accepted draft, else -1, never below 1 or above `max_length`. budget: [B] long after `reset`. A step drafts
    `width()` tokens a row, a fixed shape, and each row's budget masks what it keeps (no host read)."""

    def __init__(self, length: int = 4, kind: str = "constant", max_length: int = 16):
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"draft length must be an int >= 1, got {length!r}")
        if kind not in SCHEDULES:
            raise ValueError(f"draft length schedule must be one of {SCHEDULES}, got {kind!r}")
        self.length, self.kind = length, kind
        self.max_length = length if kind == "constant" else max(max_length, length)
        self.budget: torch.Tensor | None = None

    @classmethod
    def none(cls) -> DraftLengthSchedule:
        """No drafts at all (`NoDrafter`): a constant length of 0."""
        schedule = cls()
        schedule.length = schedule.max_length = 0
        return schedule

    def reset(self, batch_size: int, device: torch.device) -> None:
        self.budget = torch.full((batch_size,), self.length, dtype=torch.long, device=device)

    def width(self) -> int:
        """The draft width of every step: the constant length, or the longest a budget may grow to."""
        return self.max_length

    def select(self, index: torch.Tensor) -> None:
        self.budget = self.budget[index]

    def update(self, n_accepted: torch.Tensor, draft_lengths: torch.Tensor) -> None:
        if self.kind == "heuristic":
            full = (n_accepted == draft_lengths) & (draft_lengths > 0)
            self.budget.copy_(torch.where(full, self.budget + 2, self.budget - 1).clamp(1, self.max_length))
