"""The stats every decoding returns next to its output: one family.

`DecodingStats` is the base every modality shares: model calls, tokens committed per row, the acceptance map, timings,
what ran and why, `as_dict()` / `table()`. Each modality's subclass only adds: `SpecStats` (token-level speculation:
drafted / accepted counts, the acceptance histogram, a lossy rule's realised distortion; image decodings return it),
`mmspec.text.TextStats`, `mmspec.continuous.ContinuousStats`, `mmspec.video.FrameStats`.

Counters accumulate as device tensors inside the decoding loop (no host sync) and are read once at the end.
Two acceptance figures, one definition for every drafter and modality:
- acceptance_rate = accepted / drafted: of the draft tokens proposed (summed over rows and steps), the share the
  target accepted; a step whose drafter proposed nothing adds nothing to either count (None if nothing was drafted).
- mean_accepted_length (tau) = new tokens / verification steps, per row: the tokens a row commits per verification
  forward, the residual / bonus token included (as Spec-Bench counts), so tau >= 1 and tau - 1 is the mean number of
  accepted drafts per step.
Plain AR has neither: its table shows forwards and tokens only (`speculative=False`).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


def synchronize(device: torch.device) -> None:
    """Wait for `device`'s queued work (a no-op on the CPU): what makes a phase's wall-clock seconds its work's."""
    if device.type != "cpu":
        getattr(torch, device.type).synchronize(device)

@dataclass
class DecodingStats:
    """Counters of one generate call, whatever the modality.

    target_forwards: target model calls, prefill included; prefill_forwards: those that only prefilled.
    draft_forwards: draft model calls (0 for model-free drafters and plain decoding).
    steps: [B] long, verification steps (forwards after the prefill) each row took part in.
    new_tokens: [B] long, tokens generated per row (None until the call has generated).
    acceptance_map: [B, N] long, which forward committed each generated token: image decodings count the prefill as
        0, text (`speculative_generate`) counts its verification steps from 1 and marks padding after EOS with -1.
    timings: seconds spent per phase ("draft", "target", "verify", "total", ...).
    method: the decoding that ran (e.g. "SJD(window=8, ...)"); chosen_by: why, when the default chose it;
        predicted_speedup: the speedup over AR the default predicted for its choice (compare with the measured one).
    law: "lossless" (the output law is the model's) or "lossy"; `describe` sets it with `method`.
    decoding: the config of the decoding that ran (`to_config()`): given back as `decoding=`, it runs that decoding
        again, so a seeded call that `decoding="auto"` chose for repeats bit for bit wherever it runs.
    """

    target_forwards: int = 0
    prefill_forwards: int = 0
    draft_forwards: int = 0
    steps: torch.Tensor | None = None
    new_tokens: torch.Tensor | None = None
    acceptance_map: torch.Tensor | None = None
    timings: dict[str, float] = field(default_factory=dict)
    method: str | None = None
    chosen_by: str | None = None
    predicted_speedup: float | None = None
    law: str | None = None
    decoding: dict | None = None

    def describe(self, decoding) -> None:
        """Name the decoding component that ran: `method` (the settings it read, `describe()`, unless the run named
        itself) and its `law`."""
        self.method = self.method or decoding.describe()
        self.law = decoding.law
        self.decoding = decoding.to_config()

    @property
    def tokens_generated(self) -> int:
        """Tokens committed, summed over rows."""
        return 0 if self.new_tokens is None else int(self.new_tokens.sum())

    @property
    def tokens_per_target_forward(self) -> float:
        """Generated tokens per target forward a row took part in (prefill included): 1.0 for AR through
        transformers' `generate`, whose prefill yields the first token; N / (N + 1) for N tokens of the speculative
        loop drafting nothing (`NoDrafter`), whose prefill stops short of the last prompt token and yields none."""
        if self.new_tokens is None:
            return 0.0
        steps = 0 if self.steps is None else int(self.steps.sum())
        forwards = steps + self.prefill_forwards * self.new_tokens.numel()
        return self.tokens_generated / max(1, forwards)

    def as_dict(self) -> dict:
        """The figures as plain Python values (what the CLI prints and benchmarks store)."""
        described = {key: value for key, value in (("method", self.method), ("law", self.law),
                                                   ("chosen_by", self.chosen_by)) if value}
        if self.predicted_speedup is not None:
            described["predicted_speedup_vs_ar"] = round(self.predicted_speedup, 3)
        return {**described, "target_forwards": self.target_forwards, "draft_forwards": self.draft_forwards,
                "new_tokens": self.tokens_generated,
                "tokens_per_target_forward": round(self.tokens_per_target_forward, 4),
                "timings_s": {k: round(v, 4) for k, v in self.timings.items()}}

    def table(self) -> str:
        """A two-column text table of `as_dict()` for the CLI (timings one row per phase)."""
        d = self.as_dict()
        rows = [(k, v) for k, v in d.items() if k != "timings_s"]
        rows += [(f"time {k} (s)", v) for k, v in d.get("timings_s", {}).items()]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


@dataclass
class _Counts:
    """A decoding's acceptance counters on its device: hist [H] long (row-steps that accepted n drafts), totals [3]
    long (drafted, accepted, tested positions), longest: the longest draft [] long, excess: a lossy rule's summed
    excess acceptance [] float64; lossy: whether every step reported one."""

    hist: torch.Tensor
    totals: torch.Tensor
    longest: torch.Tensor
    excess: torch.Tensor
    lossy: bool = True

    @classmethod
    def new(cls, size: int, device: torch.device, old: _Counts | None = None) -> _Counts:
        long = {"dtype": torch.long, "device": device}
        counts = cls(torch.zeros(size, **long), torch.zeros(3, **long), torch.zeros((), **long),
                     torch.zeros((), dtype=torch.float64, device=device))
        if old is not None:  # a wider step than before: keep what was counted
            counts.hist[: old.hist.shape[0]] = old.hist
            counts.totals += old.totals
            counts.longest.copy_(old.longest)
            counts.excess += old.excess
            counts.lossy = old.lossy
        return counts


@dataclass
class SpecStats(DecodingStats):
    """`DecodingStats` of token-level speculation (image and text decodings, continuous tokens) adds:

    accept_hist: [L_max + 1] long, how often n draft tokens were accepted in a row-step.
    drafted: total draft tokens proposed; accepted: total draft tokens accepted.
    excess_acceptance: lossy rules only: the realised distortion per position, the total-variation distance of the
        output law from the model's at a position, averaged over the tested draft positions (up to and including
        each step's first rejection). It is measured as alpha_rule - alpha_exact, the rule's acceptance probability
        of the draft minus the exact rule's, which for LANTERN with the G* residual equals that TV exactly; 0 = none.
        excess_per_sample: the same summed over a sample's positions (mean over rows): the summed per-position TV,
        which bounds the TV of the whole sequence's law.
    speculative: False for plain AR decoding (no drafts: the acceptance fields are left out of `as_dict`).
    For trees (`record_tree_walk`): tree_acceptance: the mean over the inner nodes the walks visited of the rule's
    probability of accepting one of the node's children, and tree_alpha_star: the mean of the best any verifier could
    do at the same nodes (alpha*; None where it was not measured or is not computable at every such node);
    child_acceptance: for k = 1, 2, ..., the share of the visited inner nodes with at least k children where the walk
    accepted the k-th child drawn (the positional acceptance rates that `TreeShape.positional` builds a tree from);
    None for chains.
    """

    accept_hist: torch.Tensor = field(default_factory=lambda: torch.zeros(1, dtype=torch.long))
    drafted: int = 0
    accepted: int = 0
    excess_acceptance: float | None = None
    excess_per_sample: float | None = None
    speculative: bool = True
    _counts: _Counts | None = field(default=None, repr=False)
    tree_acceptance: float | None = None
    tree_alpha_star: float | None = None
    child_acceptance: tuple[float, ...] | None = None
    _tree_sums: torch.Tensor | None = field(default=None, repr=False)  # [4] float64, see record_tree_walk
    _child_counts: torch.Tensor | None = field(default=None, repr=False)  # [2, K] long: accepted, seen per rank
    _star_measured: bool = field(default=True, repr=False)

    def record_step(self, result, draft_lengths: torch.Tensor, rows: torch.Tensor | None = None,
                    active: torch.Tensor | None = None, stepped: torch.Tensor | None = None) -> None:
        """result: the step's VerifyResult; draft_lengths: [B'] long. `rows`: [B'] long, the indices in the caller's
        batch of the entries (default: the batch as it is); `active`: [B'] bool, which entries took part (the
        others' are ignored; default all). stepped: [B] bool, which samples took a step when a sample verifies
        several chains at once (one window per image row band: B' = B * windows); default `active`. Accumulates
        into device counters updated in place: no host sync, and a captured step (`mmspec.core.runtime.capture`) replays
        it."""
        took = (torch.ones_like(result.n_accepted, dtype=torch.bool) if active is None else active) \
            if stepped is None else stepped
        if rows is None:
            self.steps += took.long()
        else:
            self.steps.index_add_(0, rows, took.long())
        n, lengths = result.n_accepted, draft_lengths
        if self._counts is None or self._counts.hist.shape[0] < result.accept_mask.shape[1] + 1:
            self._counts = _Counts.new(result.accept_mask.shape[1] + 1, n.device, self._counts)
        counts, excess = self._counts, result.excess_acceptance
        taking = torch.ones_like(n) if active is None else active.long()
        counts.hist.scatter_add_(0, n.clamp(max=counts.hist.shape[0] - 1), taking)
        # [3, B']: the drafted, accepted and tested positions of each entry (zero for one that took no part)
        taken = torch.stack([lengths, n, torch.minimum(n + 1, lengths)]) * taking
        counts.totals += taken.sum(1)
        torch.maximum(counts.longest, taken[0].max(), out=counts.longest)
        if excess is None:
            counts.lossy = False
        else:
            counts.excess += (excess.double() * taking).sum()

    def record_tree_walk(self, node_acceptance: torch.Tensor, node_alpha_star: torch.Tensor | None,
                         node_children: torch.Tensor, accepted_rank: torch.Tensor,
                         max_children: int | None = None, active: torch.Tensor | None = None) -> None:
        """[B, D] each, at every inner node a walk visited: the rule's acceptance probability, the ceiling alpha*
        (NaN elsewhere; None when not measured), the node's children and the rank of the one accepted (-1: none).
        max_children: what bounds node_children (the tree's branching; None: read from it, a host read); active:
        [B] bool, the rows whose walk counts (default all: a row that had finished still walks in a captured batch).
        Accumulates on the device, in place (a captured step replays it): the sum and count of the acceptance at
        inner nodes, the sum of alpha* there and its NaNs, and per rank k the nodes that accepted their k-th child
        and those that have one."""
        device = node_acceptance.device
        K = int(node_children.max()) if max_children is None else max_children
        if self._tree_sums is None:
            self._tree_sums = torch.zeros(4, dtype=torch.float64, device=device)
        if self._child_counts is None or self._child_counts.shape[1] < K:
            old, self._child_counts = self._child_counts, torch.zeros(2, K, dtype=torch.long, device=device)
            if old is not None:
                self._child_counts[:, : old.shape[1]] = old
        rule = node_acceptance.double()
        counted = torch.ones_like(rule, dtype=torch.bool) if active is None else active[:, None].expand_as(rule)
        inner = ~rule.isnan() & counted
        star = rule.new_zeros(()) if node_alpha_star is None else node_alpha_star.double()
        self._star_measured &= node_alpha_star is not None
        self._tree_sums += torch.stack([torch.where(inner, rule, 0).sum(), inner.sum(),
                                        torch.where(inner & ~star.isnan(), star, 0).sum(),
                                        (inner & star.isnan()).sum()])
        ranks = torch.arange(self._child_counts.shape[1], device=device)
        counted = counted.flatten()[:, None]
        self._child_counts[0] += ((accepted_rank.flatten()[:, None] == ranks) & counted).sum(0)
        self._child_counts[1] += ((node_children.flatten()[:, None] > ranks) & counted).sum(0)

    def finalize(self, *along: torch.Tensor) -> list[torch.Tensor]:
        """Fold the device counters into the histogram, totals and tree rates, in one host transfer that also brings
        `along` (integer tensors the caller needs on the host), returned as CPU long tensors of their shapes."""
        counts, self._counts = self._counts, None
        tree = (self._tree_sums, self._child_counts) if self._tree_sums is not None else None
        self._tree_sums = self._child_counts = None
        parts = [tensor.flatten() for tensor in along]
        if counts is not None:
            parts += [counts.hist, counts.totals, counts.longest[None], counts.excess[None]]
        if tree is not None:
            parts += [tree[0], tree[1].flatten()]
        if not parts:
            return []
        read = torch.cat([part.double() for part in parts]).tolist()  # one transfer: counts < 2**53 are exact
        ends = list(itertools.accumulate(part.numel() for part in parts))
        pieces = iter([read[end - part.numel():end] for part, end in zip(parts, ends, strict=True)])
        host = [torch.tensor(next(pieces), dtype=torch.long).view(tensor.shape) for tensor in along]
        if counts is not None:
            hist, (drafted, accepted, tested), (longest,), (excess,) = (next(pieces) for _ in range(4))
            self.accept_hist = torch.tensor(hist[: int(longest) + 1], dtype=torch.long)  # n <= its draft's length
            self.drafted += int(drafted)
            self.accepted += int(accepted)
            if counts.lossy:
                self.excess_acceptance = excess / max(1, int(tested))
                self.excess_per_sample = excess / max(1, self.steps.numel())
        if tree is not None:
            (rule, inner, star, unknown), flat = next(pieces), next(pieces)
            hits, seen = flat[: len(flat) // 2], flat[len(flat) // 2:]
            self.tree_acceptance = rule / inner if inner else None
            self.tree_alpha_star = star / inner if inner and self._star_measured and not unknown else None
            self.child_acceptance = tuple(hit / count for hit, count in zip(hits, seen, strict=True) if count) or None
        return host

    @property
    def mean_accepted_length(self) -> float:
        """tau: tokens emitted per verification step per row, bonus included (1.0 for AR)."""
        steps = 0 if self.steps is None else int(self.steps.sum())
        return self.tokens_generated / max(1, steps)

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted; None when nothing was drafted (a drafter that found no match proposes nothing)."""
        return self.accepted / self.drafted if self.drafted else None

    def as_dict(self) -> dict:
        base = super().as_dict()
        timings = base.pop("timings_s")
        if not self.speculative:
            base.pop("draft_forwards")
            return {**base, "timings_s": timings}
        return {
            **base,
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": None if self.acceptance_rate is None else round(self.acceptance_rate, 4),
            **({} if self.excess_acceptance is None else {
                "lossy_excess_acceptance": round(self.excess_acceptance, 4),
                "lossy_excess_per_sample": round(self.excess_per_sample, 4),
            }),
            "accept_hist": self.accept_hist.tolist(),
            **self._tree_figures(),
            "timings_s": timings,
        }

    def _tree_figures(self) -> dict:
        """The tree figures that were measured (child_acceptance: what a positional tree is built from, so a run with
        a wide tree prints it)."""
        tree = {"tree_acceptance": self.tree_acceptance, "tree_alpha_star": self.tree_alpha_star,
                "child_acceptance": None if self.child_acceptance is None else
                [round(rate, 4) for rate in self.child_acceptance]}
        return {key: round(value, 4) if isinstance(value, float) else value for key, value in tree.items()
                if value is not None}


_SYNCHRONIZED: list[torch.device] = []  # the devices of the open `synchronized_timings` blocks, innermost last


@contextmanager
def synchronized_timings(device: torch.device | str):
    """Within the block every `PhaseTimer` phase synchronizes `device` as it starts and as it ends, so that the phase
    timings of asynchronous (CUDA) work hold the work, not only its launch. It adds host syncs to every step: for
    measurements (`mmspec.eval.bench_graphs`), not for speed."""
    _SYNCHRONIZED.append(torch.device(device))
    try:
        yield
    finally:
        _SYNCHRONIZED.pop()


class PhaseTimer:
    """Accumulates wall-clock seconds per phase into a dict: `with timer("draft"): ...` (see `synchronized_timings`
    for asynchronous devices). enabled=False: every phase is a `nullcontext` (while a graph captures a step, whose
    replays no host timer can see into, and which `torch.compile` traces)."""

    def __init__(self, timings: dict[str, float]):
        self.timings = timings
        self.enabled = True

    def __call__(self, phase: str):
        return _Phase(self.timings, phase) if self.enabled else contextlib.nullcontext()


class _Phase:
    def __init__(self, timings: dict[str, float], phase: str):
        self.timings, self.phase = timings, phase

    def __enter__(self):
        if _SYNCHRONIZED:
            synchronize(_SYNCHRONIZED[-1])
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if _SYNCHRONIZED:
            synchronize(_SYNCHRONIZED[-1])
        self.timings[self.phase] = self.timings.get(self.phase, 0.0) + time.perf_counter() - self._start
