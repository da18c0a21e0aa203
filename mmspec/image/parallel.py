"""Parallel Jacobi decoding over image rows (Liao et al., CVPR 2026, arXiv 2606.05703): several image rows decode at
once, each with its own Jacobi window, under a row-causal mask. Lossy; `rows=1` is SJD exactly.

The image's grid rows are the unit. The lowest row not yet complete decodes as in SJD (`mmspec.image.jacobi`): a window
of W target positions after its committed tokens, exact acceptance with min(1, p/q), coupled redrafts. Up to `rows - 1`
rows below it decode at the same time, each in a window of its own: row r + 1 may commit a column only `lag` columns
behind row r's committed frontier, so the tokens just above (and up to `lag` to their right) are committed when it does.
All windows (but those of rows past the image, for every sample of the batch) go through one target forward in which a
window's tokens see the committed tokens before them and the earlier tokens of their own window, and never another
window's drafts (the row-causal mask; `forward_segments` of the adapter). Each window is verified on its own with SJD's
step (`jacobi_step`): accepted drafts and one closing token are committed per window, the others stay as the next
drafts.

Deviation from the AR law. A token of row r + 1 is accepted against the target's law given the committed tokens only:
row r's tokens right of its frontier minus `lag` (and, at the start of a row, the last tokens of the row above) are
not seen. The committed image is a sample of a different joint law, where each token of a lower row is drawn without
part of its raster prefix; its keys/values are cached as computed then, so later tokens read them too. The distortion
shrinks as `lag` grows (at lag >= width no two rows overlap and the law is SJD's, exact; tested) and is measured,
not bounded:
`tests/image/test_parallel.py` measures the total-variation distance of its output law from AR's on a lookup-table
model, and the evaluation's quality run the distribution shift on the embedded model (docs/evaluation.md).

`rows=1` runs the same step with one window and gives the tokens SJD gives for the same seeds (tested), the knob at
zero of this lossy mode.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmspec.core.probs import SamplingConfig
from mmspec.core.rng import Generators, sample_seeds, uniform
from mmspec.core.stats import SpecStats
from mmspec.core.verify import VerifyResult
from mmspec.image.jacobi import DraftSpan, Ring, gumbel, initialise_drafts, jacobi_step, write_at
from mmspec.image.loop import Commits, DecodeStep, Opening
from mmspec.image.protocol import DiscreteImageModel


class RowWindowStep:
    """One iteration of parallel Jacobi decoding: a window on each of the `rows` lowest unfinished grid rows, all
    scored in one `forward_segments` call, each verified with SJD's step, the committed inputs cached with
    `commit_segments`."""

    def __init__(self, decoding, model: DiscreteImageModel, opening: Opening, sampling: SamplingConfig,
                 generator: Generators, stats: SpecStats):
        self.model, self.opening, self.sampling, self.generator, self.stats = model, opening, sampling, generator, stats
        self.W, self.R, self.lag = decoding.window, decoding.rows, decoding.lag
        self.init, self.coupling = decoding.init, decoding.coupling
        height, width = model.grid
        N, V, W, R = opening.N, opening.V, self.W, self.R
        B, device, dtype = opening.first_token.shape[0], opening.first_token.device, opening.dtype
        with opening.timer("draft"):
            self.rows = RowCommits(opening, W, stats, height, width)
            self.laws = Ring.zeros(B, R * width + 2 * W, V, dtype, device)  # all live drafts
            self.seeds = sample_seeds(generator, B).to(device) if self.coupling == "gumbel" else None
            self.span = DraftSpan.of(opening.forced, N, W, V, device)
            self.drafted = torch.zeros(B, N + W, dtype=torch.bool, device=device)
            self.drafted[:, 0] = True
            self.cached = torch.zeros(B, N, dtype=torch.bool, device=device)  # keys/values in the model's state
            self.j = torch.arange(W, device=device)

    def progress(self) -> DecodeStep:
        return self.rows.progress()

    def finish(self) -> None:
        self.rows.finish()

    def __call__(self) -> None:
        rows, opening, timer, seq, j = self.rows, self.opening, self.opening.timer, self.rows.seq, self.j
        W, R, V, N = self.W, self.R, opening.V, opening.N
        B, width = seq.shape[0], rows.width
        with timer("draft"):
            # A fixed number of draws per sample and iteration, so a sample's stream does not depend on its batch;
            # the forward's shape is fixed too (a graph replays it): windows on rows past the image run inactive.
            draws = uniform((B, R, 4, W), self.generator, seq.device, opening.dtype)
            live = min(R, rows.height)
            windows = rows.windows(live, W, self.lag)
            starts, lengths, active = windows.starts, windows.lengths, windows.active  # [B, live]
            inputs_at = starts[..., None] - 1 + j  # [B, live, W] absolute positions
            draws = draws[:, :live]
            # Window by window (their padding positions may repeat another window's): the first input of a window
            # that opens under an unfinished row is a draft of that row, then the new drafts.
            for k in range(live):
                real = active[:, k, None] & (j[:-1] < lengths[:, k, None])  # [B, W - 1]
                for at, where, u in ((inputs_at[:, k, :1], active[:, k, None], draws[:, k, 0, W - 1 :]),
                                     (inputs_at[:, k, 1:], real, draws[:, k, 0, : W - 1])):
                    new = initialise_drafts(self.init, seq, self.laws, at, where, self.drafted, u, width,
                                            opening.forced, self.span)
                    self.drafted |= _mask_at(self.drafted, at, new)
            tokens = seq.gather(1, inputs_at.flatten(1)).view(B, live, W)
            q = self.laws.read(inputs_at[..., 1:].flatten(1)).view(B, live, W - 1, V)
            orphan = rows.orphan(self.cached, windows) if R > 1 else None  # [B], -1 where none
            layout = Segments.of(inputs_at, orphan, seq)
        with timer("target"):
            logits = self.model.forward_segments(layout.tokens, layout.positions, layout.segments, opening.state)
        self.stats.target_forwards += 1
        with timer("verify"):
            outputs_at = inputs_at + 1
            p = opening.law(logits.at(slice(0, live * W)), outputs_at.flatten(1), self.sampling).view(B * live, W, V)
            g = None if self.seeds is None else gumbel(self.seeds.repeat_interleave(live), outputs_at.flatten(0, 1),
                                                       V, p.dtype)
            result = jacobi_step(p, tokens[..., 1:].flatten(0, 1), q.flatten(0, 1), lengths.flatten(),
                                 draws[:, :, 1:].flatten(0, 1), self.coupling, g)
            n = result.verify.n_accepted.view(B, live)
            written = active[..., None] & (j <= lengths[..., None])  # [B, live, W] the real outputs
            step_tokens, step_laws = result.tokens.view(B, live, W), result.laws.view(B, live, W, V)
            for k in range(live):
                write_at(seq, outputs_at[:, k], step_tokens[:, k], written[:, k])
                self.laws.write(outputs_at[:, k], step_laws[:, k], written[:, k])
            self.drafted |= _mask_at(self.drafted, outputs_at.flatten(1), written.flatten(1))
            # Cache the window inputs that are now committed: the accepted drafts and the first input when it is
            # committed (a draft of the row above stays out); the orphaned closing token always.
            first_committed = rows.committed_at(inputs_at[..., 0])
            keep = active[..., None] & (j <= n[..., None]) & ((j > 0) | first_committed[..., None])
            keep = keep.flatten(1)
            if orphan is not None:
                keep = torch.cat([keep, (orphan >= 0)[:, None]], 1)
            self.cached |= _mask_at(self.cached, layout.positions.clamp(max=N - 1), keep)
            rows.advance(starts, n, active, result.verify, lengths)
        with timer("target"):
            self.model.commit_segments(opening.state, keep)


@dataclass(frozen=True)
class RowWindows:
    """One iteration's row windows, [B, R] each: their first target position (starts), their real drafts (lengths;
    target positions = lengths + 1) and whether they run (active)."""

    starts: torch.Tensor
    lengths: torch.Tensor
    active: torch.Tensor


@dataclass(frozen=True)
class Segments:
    """The tokens of one `forward_segments` call, [B, T] each: the row windows back to back (segment k = window k),
    then, when the step runs several rows, one slot for an orphaned closing token (the last segment; position 0 when
    unused)."""

    tokens: torch.Tensor
    positions: torch.Tensor
    segments: torch.Tensor

    @classmethod
    def of(cls, inputs_at: torch.Tensor, orphan: torch.Tensor | None, seq: torch.Tensor) -> Segments:
        """inputs_at: [B, R', W] the windows' input positions; orphan: [B] (-1 where none), or None for no slot."""
        B, R, W = inputs_at.shape
        positions = inputs_at.flatten(1)
        segments = torch.arange(R, device=seq.device).repeat_interleave(W).expand(B, -1)
        if orphan is not None:
            positions = torch.cat([positions, orphan.clamp(min=0)[:, None]], 1)
            segments = torch.cat([segments, torch.full((B, 1), R, device=seq.device)], 1)
        return cls(seq.gather(1, positions), positions, segments)


class RowCommits(Commits):
    """`Commits` where the committed tokens need not be a prefix: each grid row commits a prefix of itself.

    done: [B, N] bool, the committed positions; `committed` stays the length of the committed raster prefix (what
    `DecodeStep.n_committed` reports and the loop waits on)."""

    def __init__(self, opening: Opening, extra: int, stats: SpecStats, height: int, width: int):
        super().__init__(opening, extra, stats)
        self.height, self.width = height, width
        self.done = torch.zeros(opening.first_token.shape[0], opening.N, dtype=torch.bool,
                                device=opening.first_token.device)
        self.done[:, 0] = True

    def committed_at(self, positions: torch.Tensor) -> torch.Tensor:
        """Whether each of `positions` (any shape, values >= -1) is committed; -1 never is."""
        flat = positions.flatten(1)
        return (self.done.gather(1, flat.clamp(min=0)) & (flat >= 0)).view_as(positions)

    def windows(self, R: int, W: int, lag: int) -> RowWindows:
        """The row windows of this iteration: the lowest unfinished row and the R - 1 rows after it. Row k >= 1 may
        commit up to `lag` columns short of row k - 1's frontier; the lowest row runs across its row end (as SJD
        does) unless the next row has begun."""
        B, device, w = self.done.shape[0], self.done.device, self.width
        in_row = self.done.view(B, self.height, w).long().cumprod(-1).sum(-1)  # [B, H] committed prefix of a row
        lowest = (in_row == w).long().sum(1)  # rows finish in order
        rows = lowest[:, None] + torch.arange(R, device=device)
        exists = rows < self.height
        row = rows.clamp(max=self.height - 1)
        starts = row * w + in_row.gather(1, row)  # [B, R] each row's frontier
        limit = torch.cat([torch.full_like(starts[:, :1], self.N), starts[:, :-1] + w - lag], 1)
        active = exists & (limit > starts)
        if R > 1:  # the lowest row stops at its row end once the next row has committed or runs now
            begun = (in_row.gather(1, row[:, 1:2]).squeeze(1) > 0) | active[:, 1]
            limit[:, 0] = torch.where(begun, (row[:, 0] + 1) * w, self.N)
        lengths = ((limit - starts).clamp(max=W) - 1).clamp(min=0)
        return RowWindows(starts, lengths, active)

    def orphan(self, cached: torch.Tensor, windows: RowWindows) -> torch.Tensor:
        """[B] the committed position whose keys/values are not cached and which no window of this iteration starts
        from (a row's closing token when the next row had begun), -1 where there is none (at most one per sample)."""
        loose = (self.done & ~cached).scatter(1, windows.starts - 1, False)
        position = loose.long().argmax(1)
        return torch.where(loose.any(1), position, -1)

    def advance(self, starts: torch.Tensor, n: torch.Tensor, active: torch.Tensor, result: VerifyResult,
                lengths: torch.Tensor) -> None:
        """Commit n + 1 tokens from each active window's start (starts, n, active, lengths: [B, R]) and record the
        step per window."""
        self.step += 1
        position = torch.arange(self.N, device=starts.device)
        window = (position >= starts[..., None]) & (position <= (starts + n)[..., None]) & active[..., None]
        newly = window.any(1) & ~self.done  # [B, N]
        self.done |= newly
        self.stats.acceptance_map.copy_(torch.where(newly, self.step, self.stats.acceptance_map))  # no .item()
        self.stats.record_step(result, lengths.flatten(), active=active.flatten(), stepped=active.any(1))
        self.committed.copy_(self.done.long().cumprod(1).sum(1))

    def committed_mask(self) -> torch.Tensor:
        return self.done


def _mask_at(mask: torch.Tensor, positions: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """A bool tensor shaped like `mask` [B, S]: True at positions[b, t] where `where` [B, T] holds (repeated
    positions are OR-ed)."""
    hits = torch.zeros(mask.shape, dtype=torch.long, device=mask.device)
    return hits.scatter_add_(1, positions, where.long()) > 0
