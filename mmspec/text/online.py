"""Online speculative decoding (OSD, arXiv 2310.07177; DistillSpec's losses, arXiv 2310.08461): the draft LM
(`OnlineDistillation`) or a draft head on the target's features (`OnlineHeadDistillation`, EAGLE or Hydra) keeps
learning from the target while it serves.

After each request the served rows go into a bounded buffer with the target's law at the positions it recorded: every
new token (`positions="all"`) or only those the target drew itself, the residual and bonus tokens where the draft
was rejected or ran out (`"corrected"`, OSD's choice). Every `every` requests a background thread takes a few optimiser
steps on a copy of the draft (the student), pulling its law at those positions toward the target's with forward KL or
total variation (acceptance is 1 − TV(p, q)); the request that comes next is never held up by the update. The
student's weights are copied into the serving draft only between requests, so every draft of a request comes from one
set of weights and its recorded law: verification stays exact whatever the draft learned.

The target's laws are read with one forward over each finished request (verification computed the same rows, but a
captured step would have to carry a [B, N, V] buffer to hand them over); a head's rows also keep the features that
forward gave at every token, what the head reads. A head learns teacher-forced, EAGLE unrolled as in its training
(`mmspec.core.training.heads`), every depth's law at a recorded token pulled toward the target's. The copy into the
draft is in place, so captured CUDA graphs of the draft stay valid.
"""

from __future__ import annotations

import copy
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mmspec.adapters.causal_lm import as_causal_model
from mmspec.adapters.features import bind_head
from mmspec.core.training.heads import Pairs, aligned, unrolled_predictions

DIVERGENCES = ("fkl", "tvd")
POSITIONS = ("corrected", "all")


@dataclass(frozen=True)
class ServedRow:
    """One served row. ids: [T] long, its prompt (no padding) and new tokens; positions: [P] long, the indices in
    `ids` of the recorded tokens; target_logprobs: [P, V], the target's log-law each of them was drawn from;
    features: [T, w], the target's features at each token (what a head reads; None for a draft LM)."""

    ids: torch.Tensor
    positions: torch.Tensor
    target_logprobs: torch.Tensor
    features: torch.Tensor | None = None


def copy_sharing(module: torch.nn.Module, shared: tuple = ()) -> torch.nn.Module:
    """A deep copy of `module` that holds the very modules `shared`, not copies of them."""
    return copy.deepcopy(module, {id(part): part for part in shared})


def frozen_view(module: torch.nn.Module) -> torch.nn.Module:
    """`module` reading the same weights, detached: a loss through it computes no gradient of them."""
    view = copy.copy(module)
    view._parameters = {name: None if weight is None else torch.nn.Parameter(weight.detach(), requires_grad=False)
                        for name, weight in module._parameters.items()}
    return view


def divergence(student_logits: torch.Tensor, target_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """Mean over positions of D(p ‖ q): student_logits, target_logprobs [P, V] (q from the logits, p the target's);
    "fkl": KL(p ‖ q), the soft cross-entropy less p's entropy; "tvd": ½ Σ |p − q| = 1 − Σ min(p, q)."""
    log_q = F.log_softmax(student_logits.float(), -1)
    p = target_logprobs.float().exp()
    if kind == "fkl":
        return (p * (target_logprobs.float() - log_q)).sum(-1).mean()
    if kind == "tvd":
        return 0.5 * (p - log_q.exp()).abs().sum(-1).mean()
    raise ValueError(f"divergence must be one of {DIVERGENCES}, got {kind!r}")


def positions_of(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] position ids of left- or right-padded rows (`mask` 1 on tokens): each row counts from 0 at its first
    token, as the decodings place them."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def student_logits(model, rows: list[ServedRow]) -> tuple[torch.Tensor, torch.Tensor]:
    """The student's logits that predicted every recorded token of `rows` ([P, V], the logit at index t − 1 predicts
    the token at t) and the target's log-laws at those tokens ([P, V]), the rows right-padded into one batch."""
    device = next(model.parameters()).device
    width = max(len(r.ids) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, : len(row.ids)], mask[b, : len(row.ids)] = row.ids.to(device), 1
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions_of(ids, mask)).logits
    which = torch.cat([torch.full_like(r.positions, b) for b, r in enumerate(rows)]).to(device)
    before = torch.cat([r.positions for r in rows]).to(device) - 1
    return logits[which, before], torch.cat([r.target_logprobs for r in rows]).to(device)


def head_student_logits(head, rows: list[ServedRow], unroll: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A head's logits for every recorded token of `rows`, at every depth that predicts it, teacher-forced on the
    rows' tokens and target features (an EAGLE head unrolled `unroll` steps: depth d reads its own d earlier
    predictions), and the target's log-laws beside them: ([M, V], [M, V]). The token at index t of a row is label
    column t - 2 of its pairs (x_{j+1}, f_j); depth d holds it at column t - 2 - d of its aligned predictions."""
    device = next(head.parameters()).device
    width = max(len(r.ids) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    features = torch.zeros(len(rows), width, rows[0].features.shape[-1], device=device)
    for b, row in enumerate(rows):
        ids[b, : len(row.ids)], features[b, : len(row.ids)] = row.ids.to(device), row.features.to(device).float()
    batch = Pairs(ids[:, 1:], features[:, :-1], None, None, torch.arange(1, width, device=device).expand(len(rows), -1))
    which = torch.cat([torch.full_like(r.positions, b) for b, r in enumerate(rows)]).to(device)
    column = torch.cat([r.positions for r in rows]).to(device) - 2
    target_logprobs = torch.cat([r.target_logprobs for r in rows]).to(device)
    logits, laws = [], []
    for d, hidden in enumerate(aligned(head, unrolled_predictions(head, batch, unroll, 0.0))):
        keep = (column - d >= 0) & (column - d < hidden.shape[1])
        logits.append(head.logits(hidden[which[keep], (column - d)[keep]]))
        laws.append(target_logprobs[keep])
    return torch.cat(logits), torch.cat(laws)


class OnlineDistillation:
    """Keeps `draft` (a transformers causal LM, the serving draft) learning from the target between requests.

    Call `before_request()` before each request (it swaps in a finished update) and `after_request(target,
    sequences, prompt_mask, stats)` after it (it records the rows and starts an update every `every` requests).
    every: requests between two updates (OSD: 8); buffer: the most rows kept (the oldest leave first); steps: optimiser
    steps per update, each on up to `rows_per_step` rows drawn from the buffer; lr: AdamW's learning rate;
    divergence: "fkl" or "tvd"; positions: "corrected" or "all" (see the module docstring); background: False runs
    each update inside `after_request` and swaps it in at the next `before_request` (the same schedule, blocking,
    reproducible whatever the machine's speed: for experiments and tests). `updates` counts the updates swapped in,
    `losses` the divergence before each step."""

    def __init__(self, draft: torch.nn.Module, *, every: int = 8, buffer: int = 256, steps: int = 4,
                 rows_per_step: int = 16, lr: float = 3e-4, divergence: str = "fkl", positions: str = "corrected",
                 seed: int = 0, background: bool = True):
        for name, value, low in (("every", every, 1), ("buffer", buffer, 1), ("steps", steps, 1),
                                 ("rows_per_step", rows_per_step, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not lr > 0:
            raise ValueError(f"lr must be a number > 0, got {lr!r}")
        if divergence not in DIVERGENCES:
            raise ValueError(f"divergence must be one of {DIVERGENCES}, got {divergence!r}")
        if positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {positions!r}")
        if not isinstance(draft, torch.nn.Module):
            raise TypeError(f"draft must be a torch.nn.Module (a causal LM), got {type(draft).__name__}")
        self.draft, self.every, self.steps, self.rows_per_step = draft, every, steps, rows_per_step
        self.divergence, self.positions = divergence, positions
        self.buffer: deque[ServedRow] = deque(maxlen=buffer)
        self.student = self.student_of(draft)
        self.optimizer = torch.optim.AdamW(self.student.parameters(), lr=lr, weight_decay=0.0)
        self.sampler = torch.Generator().manual_seed(seed)
        self.requests, self.updates, self.losses = 0, 0, []
        self.background = background
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmspec-online")
        self._running: Future | None = None
        self._lock = threading.Lock()  # the buffer: appended by the serving thread, sampled by the worker

    def student_of(self, draft: torch.nn.Module) -> torch.nn.Module:
        """The copy of the draft that learns (float32, in training mode)."""
        return copy.deepcopy(draft).float().train()

    def target_features(self) -> torch.Tensor | None:
        """[B, S, w], what a head reads of the target's last forward (None: a draft LM reads none)."""
        return None

    def loss(self, rows: list[ServedRow]) -> torch.Tensor:
        """The student's divergence from the target at the recorded tokens of `rows`."""
        return divergence(*student_logits(self.student, rows), self.divergence)

    def before_request(self) -> bool:
        """Swap a finished update's weights into the draft (True if one was swapped in); never waits for one."""
        if self._running is None or not self._running.done():
            return False
        self._running.result()  # an update's error surfaces here, in the serving thread
        self._running = None
        with torch.no_grad():
            for served, learned in zip(self.draft.parameters(), self.student.parameters(), strict=True):
                served.copy_(learned)
        self.updates += 1
        return True

    @torch.no_grad()
    def after_request(self, target, sequences: torch.Tensor, prompt_mask: torch.Tensor, stats) -> None:
        """Record a finished request: sequences [B, T + N] (left-padded prompts of mask `prompt_mask` [B, T], then
        the new tokens), stats: its `TextStats` (new_tokens, from_draft). Starts an update every `every` requests
        if none is running."""
        self.record(target, sequences, prompt_mask, stats)
        self.requests += 1
        if self.requests % self.every == 0 and self._running is None:
            self._running = self._worker.submit(self._update)
            if not self.background:
                self._running.exception()  # wait for it

    def record(self, target, sequences: torch.Tensor, prompt_mask: torch.Tensor, stats) -> None:
        width = prompt_mask.shape[1]
        new = torch.arange(sequences.shape[1] - width, device=sequences.device)
        produced = new[None] < stats.new_tokens[:, None].to(sequences.device)  # [B, N]: tokens, not padding
        mask = torch.cat([prompt_mask, produced.long()], 1)
        recorded = produced if self.positions == "all" else produced & ~stats.from_draft.to(sequences.device)
        logits = target(input_ids=sequences, attention_mask=mask, position_ids=positions_of(sequences, mask)).logits
        features = self.target_features()
        padding = (1 - prompt_mask).sum(-1).tolist()
        rows = []
        for b, pad in enumerate(padding):  # one row at a time, after the request: no decoding step waits on it
            where = recorded[b].nonzero().squeeze(-1) + width
            if len(where):  # the law only where it is recorded: the logit at t - 1 predicted the token at t
                logprobs = F.log_softmax(logits[b, where - 1].float(), -1)
                tokens = mask[b, pad:].bool()
                rows.append(ServedRow(sequences[b, pad:][tokens].cpu(), (where - pad).cpu(),
                                      logprobs.to(torch.float16).cpu(),
                                      None if features is None else features[b, pad:][tokens].to(torch.float16).cpu()))
        with self._lock:
            self.buffer.extend(rows)

    def _update(self) -> None:
        with self._lock:
            served = list(self.buffer)
        for _ in range(self.steps):
            pick = torch.randperm(len(served), generator=self.sampler)[: self.rows_per_step].tolist()
            loss = self.loss([served[i] for i in pick])
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.student.parameters(), 1.0)
            self.optimizer.step()
            self.losses.append(loss.item())

    def wait(self) -> None:
        """Block until a running update has finished and swap it in (between streams, or before closing)."""
        if self._running is not None:
            self._running.result()
            self.before_request()

    def close(self) -> None:
        self.wait()
        self._worker.shutdown()


class OnlineHeadDistillation(OnlineDistillation):
    """Keeps a draft `head` (an `EagleHead` or `HydraHead` bound to `target`, a transformers causal LM) learning
    from the target between requests, as `OnlineDistillation` does a draft LM: each finished request is re-read by
    the target, whose features at its tokens go into the buffer beside the recorded laws, and the student (a copy
    of the head, sharing the target's embedding and LM head) learns teacher-forced on them, an EAGLE head unrolled
    `unroll` steps. Options as `OnlineDistillation`'s."""

    def __init__(self, target, head: torch.nn.Module, *, unroll: int = 2, **options):
        if isinstance(unroll, bool) or not isinstance(unroll, int) or unroll < 0:
            raise ValueError(f"unroll must be an int >= 0, got {unroll!r}")
        if not isinstance(head, torch.nn.Module) or not hasattr(head, "logits"):
            raise TypeError(f"head must be a draft head (EagleHead or HydraHead), got {type(head).__name__}")
        self.tap = bind_head(head, as_causal_model(target))
        self.unroll = unroll
        super().__init__(head, **options)

    def student_of(self, head: torch.nn.Module) -> torch.nn.Module:
        """A copy of the head reading through the target's own embedding and LM head (`bind_head`), detached: the
        student learns, the target's weights get no gradient."""
        student = copy_sharing(head, (head.embedding, head.lm_head)).float().train()
        student.bind(frozen_view(head.embedding), frozen_view(head.lm_head))
        return student

    def target_features(self) -> torch.Tensor:
        return self.tap.features

    def loss(self, rows: list[ServedRow]) -> torch.Tensor:
        return divergence(*head_student_logits(self.student, rows, self.unroll), self.divergence)
