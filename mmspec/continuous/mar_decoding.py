"""MAR generation: masked random-order AR over continuous tokens, with one model (the baseline) or speculatively with
a draft and a target model.

Each sample has its own random order; step s predicts the next `plan[s]` positions of it (MAR's cosine schedule:
`floor(L cos(pi/2 (s+1)/num_iter))` tokens stay unknown after step s, at least one is predicted per step, the last
step predicts the rest). The tokens of one step are conditionally independent given the known ones, each drawn by
the diffusion head from noise keyed by (sample seed, position, diffusion step, attempt), so draft and target
trajectories of a token start from the same noise and discarded work never shifts another token's randomness.

One loop (`decode`) runs every continuous decoding; a step strategy does each step's work. `TargetSteps` (AR): the
target draws every step. `SpeculativeSteps` (`ContinuousSpeculation`): the target runs the first `n_prefill` steps
itself; then the draft runs `gamma` steps, after which one target pass conditioned on the context from before those
steps scores all their tokens and each is kept or resampled independently (the exact trajectory-level rule, or a
continuous rule's own test: CSpD's released rule, `mmspec.continuous.paper`). With the exact rule the output follows
**the target on the coarsened schedule** (`coarsen(plan, n_prefill, gamma)`: the drafted steps of a block merged into
one step), which is what the tests compare against, not the target on `plan`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from mmspec.continuous.acceptance import TrajectoryBlock, TrajectoryTest, verify_block
from mmspec.continuous.diffusion import DiffusionSchedule, Trajectory
from mmspec.continuous.graphs import SamplerGraphs, sample
from mmspec.continuous.stats import ContinuousStats
from mmspec.core.progress import Halt, Progress
from mmspec.core.rng import keyed_normal, keyed_uniform

NOISE, UNIFORM, ORDER = 0, 1, 2  # key domains of the keyed draws


def cosine_plan(seq_len: int, num_iter: int) -> list[int]:
    """Tokens predicted at each of `num_iter` steps (MAR's cosine mask schedule); sums to seq_len."""
    if not 1 <= num_iter <= seq_len:
        raise ValueError(f"num_iter must be in [1, {seq_len}] (at least one token per step), got {num_iter}")
    unknown, counts = seq_len, []
    for step in range(num_iter):
        left = max(1, min(unknown - 1, math.floor(seq_len * math.cos(math.pi / 2 * (step + 1) / num_iter))))
        count = unknown if step == num_iter - 1 else unknown - left
        counts.append(count)
        unknown -= count
    return counts


def coarsen(plan: list[int], n_prefill: int, gamma: int) -> list[int]:
    """The schedule the exact speculative mode samples: the first n_prefill steps as they are, then blocks of gamma
    steps merged into one."""
    rest = plan[n_prefill:]
    return plan[:n_prefill] + [sum(rest[i : i + gamma]) for i in range(0, len(rest), gamma)]


def sample_orders(seeds: torch.Tensor, seq_len: int) -> torch.Tensor:
    """[B, L] long: a random permutation of the positions per sample, keyed by the sample's seed."""
    return keyed_uniform(seeds[:, None], ORDER, torch.arange(seq_len)[None, :]).argsort(dim=1)


class _Conditioner:
    """One model's encoder-decoder pass and head for the tokens of a step (CFG at the step's scale); graphs:
    where its head's reverse chains replay from (None: eager)."""

    def __init__(self, model, labels: torch.Tensor | None, guidance_scale: float, graphs: SamplerGraphs | None = None):
        self.model, self.labels, self.guidance_scale, self.graphs = model, labels, guidance_scale, graphs

    def z(self, tokens: torch.Tensor, unknown: torch.Tensor, positions: torch.Tensor, known_tokens: int):
        """(z, z_uncond) [B * n, D_dec] of `positions` [B, n] given the known tokens (`known_tokens` per row)."""
        B = tokens.shape[0]
        cfg = self.guidance_scale != 1.0
        embedding = self.model.class_embedding(self.labels, B)
        if cfg:
            embedding = torch.cat([embedding, self.model.class_embedding(None, B)])
            tokens, unknown = torch.cat([tokens, tokens]), torch.cat([unknown, unknown])
        z = self.model.encode_decode(tokens, unknown, embedding, known_tokens)
        index = positions.repeat(2, 1) if cfg else positions
        z = z.gather(1, index[..., None].expand(-1, -1, z.shape[-1]))
        if not cfg:
            return z.reshape(-1, z.shape[-1]), None
        cond, uncond = z.chunk(2)
        return cond.reshape(-1, z.shape[-1]), uncond.reshape(-1, z.shape[-1])


CFG_SCHEDULES = ("linear", "constant")


def check_cfg_schedule(cfg_schedule) -> None:
    if cfg_schedule not in CFG_SCHEDULES:
        raise ValueError(f"cfg_schedule must be one of {CFG_SCHEDULES}, got {cfg_schedule!r}")


def guidance_at(guidance_scale: float, cfg_schedule: str, seq_len: int, unknown_after: int) -> float:
    """The guidance scale of a step after which `unknown_after` of the seq_len tokens are still unknown, as LTH14/mar's
    `sample_tokens` sets it: "constant" = s; "linear" (Muse's) = 1 + (s - 1) (L - m) / L, where m is the step's mask
    length, the unknown count floored at 1, so the last step is guided by 1 + (s - 1) (L - 1) / L, not s."""
    if cfg_schedule == "constant":
        return guidance_scale
    return 1 + (guidance_scale - 1) * (seq_len - max(unknown_after, 1)) / seq_len


def _noise(seeds, positions, schedule, dim, attempt=0):
    """(x_T [m, C], noise [S, m, C]) for tokens (seeds [m], positions [m]) at a residual attempt (0 = first draw; an
    int or [m] long)."""
    steps = torch.arange(schedule.num_steps + 1)[:, None]
    draws = keyed_normal(seeds[None, :], NOISE, positions[None, :], steps, attempt, dim=dim)
    return draws[-1], draws[:-1]


def _draw_step(conditioner: _Conditioner, state: MARState, positions: torch.Tensor, schedule: DiffusionSchedule,
               cfg: float, temperature: float):
    """One MAR step with the conditioner's model: draw the tokens at `positions` [B, n] from keyed noise, write them
    into the state's tokens and mark them known (in place). Returns (z, z_uncond, trajectory)."""
    tokens, unknown = state.tokens, state.unknown
    (B, n), C = positions.shape, tokens.shape[2]
    z, z_uncond = conditioner.z(tokens, unknown, positions, state.known)
    x_T, noise = _noise(state.seeds.repeat_interleave(n), positions.reshape(-1), schedule, C)
    scale = torch.full((z.shape[0],), cfg, device=z.device)
    trajectory = sample(conditioner.model, z, z_uncond, scale, schedule, x_T, noise, temperature, conditioner.graphs)
    tokens.scatter_(1, positions[..., None].expand(-1, -1, C), trajectory.token.view(B, n, C).to(tokens.dtype))
    unknown.scatter_(1, positions, False)
    state.known += n
    return z, z_uncond, trajectory


def _check(model, seeds: torch.Tensor, labels: torch.Tensor | None) -> None:
    for method in ("class_embedding", "encode_decode", "diffusion_head"):
        if not callable(getattr(model, method, None)):
            raise TypeError(f"model must provide {method}() (the MAR adapter protocol), got {type(model).__name__}")
    if not isinstance(seeds, torch.Tensor) or seeds.ndim != 1 or seeds.dtype != torch.long:
        raise TypeError("seeds must be a [B] long tensor (one seed per sample)")
    if labels is not None and labels.shape != seeds.shape:
        raise ValueError(f"labels must have shape {tuple(seeds.shape)}, got {tuple(labels.shape)}")


def _check_draft(target, draft, seeds: torch.Tensor, labels: torch.Tensor | None) -> None:
    if draft is None:
        raise ValueError("decoding='speculative' needs a draft MAR; this pipeline has none")
    _check(draft, seeds, labels)
    dims = {name: (m.config.seq_len, m.config.token_dim) for name, m in (("target", target), ("draft", draft))}
    if dims["target"] != dims["draft"]:
        raise ValueError(f"draft tokens (seq_len, token_dim) = {dims['draft']} do not match the target's "
                         f"{dims['target']}")


@dataclass
class MARState:
    """A continuous decoding in progress: tokens [B, L, C] (zeros where unknown), unknown [B, L] bool, the stats,
    the keyed draws' seeds [B] and the tokens known per row (the same in every row: what `unknown` says, kept on the
    host); a step strategy fills it."""

    tokens: torch.Tensor
    unknown: torch.Tensor
    seeds: torch.Tensor
    stats: ContinuousStats
    known: int = 0


class TargetSteps:
    """Every step drawn by the target (plain MAR sampling)."""

    def __init__(self, target, labels, guidance_scale: float, schedule: DiffusionSchedule, temperature: float,
                 graphs: SamplerGraphs | None = None):
        self.conditioner = _Conditioner(target, labels, guidance_scale, graphs)
        self.schedule, self.temperature = schedule, temperature

    def __call__(self, state: MARState, step: int, positions: torch.Tensor, cfg: float, last: bool) -> bool:
        """Draw the step's tokens; whether a target pass happened (the caller then shows the step)."""
        _draw_step(self.conditioner, state, positions, self.schedule, cfg, self.temperature)
        state.stats.target_forwards += 1
        return True


class SpeculativeSteps:
    """The target's first `n_prefill` steps, then blocks of `gamma` draft steps verified in one target pass."""

    def __init__(self, target, draft, labels, guidance_scale: float, schedule: DiffusionSchedule, temperature: float,
                 speculation, num_iter: int, state: MARState, graphs: SamplerGraphs | None = None):
        _check_draft(target, draft, state.seeds, labels)
        state.stats = ContinuousStats(log_ratio_terms={}, residual_tries=[])
        n_prefill = math.floor(num_iter * speculation.prefill_ratio)
        unknown = state.unknown
        self.target_steps = TargetSteps(target, labels, guidance_scale, schedule, temperature, graphs)
        self.draft = _Conditioner(draft, labels, guidance_scale, graphs)
        self.target, self.schedule, self.temperature = target, schedule, temperature
        self.speculation, self.n_prefill = speculation, n_prefill
        self.test = speculation.acceptance if isinstance(speculation.acceptance, TrajectoryTest) else None
        self.block: list[dict] = []  # the draft steps since the last verification
        # what the target conditions on: the tokens known before the block (and how many per row)
        self.context, self.context_known = unknown.clone(), state.known

    def __call__(self, state: MARState, step: int, positions: torch.Tensor, cfg: float, last: bool) -> bool:
        if step < self.n_prefill:
            self.target_steps(state, step, positions, cfg, last)
        else:
            z, z_uncond, trajectory = _draw_step(self.draft, state, positions, self.schedule, cfg, self.temperature)
            state.stats.draft_forwards += 1
            self.block.append(dict(positions=positions, z=z, z_uncond=z_uncond, cfg=cfg, trajectory=trajectory))
            if len(self.block) < self.speculation.gamma and not last:
                return False
            self.verify(state)
            self.block = []
        self.context, self.context_known = state.unknown.clone(), state.known
        return True

    def target_chain(self, z: torch.Tensor, z_uncond: torch.Tensor | None, cfg: torch.Tensor):
        """The target head's reverse chains of given rows of the block (conditions z, z_uncond [n, D], guidance
        cfg [n]), replayed from the sampler graphs when the decoding has them (one graph per row count)."""
        graphs = self.draft.graphs

        def chain(x_T: torch.Tensor, noise: torch.Tensor, rows: torch.Tensor) -> Trajectory:
            return sample(self.target, z[rows], None if z_uncond is None else z_uncond[rows], cfg[rows],
                          self.schedule, x_T, noise, self.temperature, graphs)
        return chain

    def verify(self, state: MARState) -> None:
        """One target pass over the block's positions (conditioned on the tokens known before the block), then
        per-token accept / resample; writes the kept tokens into the state."""
        block, tokens, stats = self.block, state.tokens, state.stats
        B, C = tokens.shape[0], tokens.shape[2]
        positions = torch.cat([b["positions"] for b in block], dim=1)  # [B, n_blk]
        n_blk = positions.shape[1]
        z, z_uncond = self.target_steps.conditioner.z(tokens, self.context, positions, self.context_known)
        stats.target_forwards += 1

        def per_token(key):  # [B * n_blk, ...] in the order of `positions`' rows, from the per-step pieces
            return torch.cat([b[key].view(B, b["positions"].shape[1], *b[key].shape[1:]) for b in block],
                             1).flatten(0, 1)

        cfg = torch.cat([torch.full(b["positions"].shape, b["cfg"], device=positions.device) for b in block],
                        dim=1).reshape(-1)
        draft_trajectory = type(block[0]["trajectory"])(
            *(torch.cat([getattr(b["trajectory"], f).view(-1, B, b["positions"].shape[1], C) for b in block], 2)
              .flatten(1, 2) for f in ("x", "mean", "log_std")))
        draft_head = self.draft.model.diffusion_head(per_token("z"), None if block[0]["z_uncond"] is None else
                                                     per_token("z_uncond"), cfg)
        target_head = self.target.diffusion_head(z, z_uncond, cfg)
        row_seeds, flat = state.seeds.repeat_interleave(n_blk), positions.reshape(-1)
        trajectories = TrajectoryBlock(
            draft_trajectory, draft_head, target_head, self.schedule, self.temperature,
            noise=lambda attempts, rows: _noise(row_seeds[rows], flat[rows], self.schedule, C, attempts),
            final_noise=lambda attempts, rows: keyed_normal(row_seeds[rows], NOISE, flat[rows], -1, attempts, dim=C),
            uniform=lambda attempts, rows: keyed_uniform(row_seeds[rows], UNIFORM, flat[rows], attempts),
            max_tries=self.speculation.max_tries, proposals_per_round=self.speculation.proposals_per_round,
            target_chain=self.target_chain(z, z_uncond, cfg))
        result = verify_block(trajectories) if self.test is None else self.test.verify_block(trajectories)
        tokens.scatter_(1, positions[..., None].expand(-1, -1, C), result.tokens.view(B, n_blk, C).to(tokens.dtype))
        stats.drafted += result.accepted.numel()
        stats.accepted += int(result.accepted.sum())
        stats.residual_tries.append(result.tries[~result.accepted].cpu())
        stats.fallbacks += int(result.fallback.sum())
        for name, value in (result.terms or {"log_ratio": result.log_ratio}).items():
            stats.log_ratio_terms.setdefault(name, []).append(value.cpu())


@dataclass(kw_only=True)
class ContinuousProgress(Progress):
    """A continuous decoding's progress (`mmspec.core.progress`) after a target pass: step, the MAR step; n_done, the
    tokens known per row; latents [B, L, C] (zeros where unknown) and known [B, L] bool, snapshots; stats, the run's
    `ContinuousStats`, in the last progress only (else None)."""

    latents: torch.Tensor
    known: torch.Tensor
    stats: ContinuousStats | None = None


@torch.no_grad()
def decode(decoding, target, draft, seeds: torch.Tensor, num_iter: int, schedule: DiffusionSchedule,
           labels: torch.Tensor | None = None, guidance_scale: float = 1.0, temperature: float = 1.0,
           plan: list[int] | None = None, graphs: SamplerGraphs | None = None,
           cfg_schedule: str = "linear") -> Iterator[ContinuousProgress]:
    """The loop of every continuous decoding (`ContinuousDecoding.run`): a `ContinuousProgress` after every target
    pass (a speculative run's draft steps are never shown), the last one with the tokens and the stats. AR runs the
    target on `plan` (default MAR's cosine schedule of `num_iter` steps); `ContinuousSpeculation` drafts with `draft`.
    graphs: the diffusion heads' chains replay from there (`mmspec.continuous.graphs`; None: eager). cfg_schedule:
    how the guidance scale moves over the steps (`guidance_at`: "linear" or "constant"). `progress.stop()` ends the
    decoding after that pass (its last progress then has the tokens known so far)."""
    _check(target, seeds, labels)
    check_cfg_schedule(cfg_schedule)
    B, L, C = seeds.numel(), target.config.seq_len, target.config.token_dim
    given_plan, plan = plan, cosine_plan(L, num_iter) if plan is None else plan
    if sum(plan) != L or min(plan) < 1:
        raise ValueError(f"plan must be positive token counts summing to seq_len={L}, got {plan}")
    state = MARState(torch.zeros(B, L, C, device=target.device, dtype=target.dtype),
                     torch.ones(B, L, dtype=torch.bool, device=target.device), seeds,
                     ContinuousStats(speculative=False))
    steps = decoding.steps(target, draft, labels, guidance_scale, schedule, temperature, num_iter, given_plan, state,
                           graphs)
    orders, done, start, halt = sample_orders(seeds, L), 0, time.perf_counter(), Halt()
    for step, count in enumerate(plan):
        positions = orders[:, done : done + count]  # [B, n]
        done += count
        cfg = guidance_at(guidance_scale, cfg_schedule, L, L - done)
        last = step == len(plan) - 1
        if steps(state, step, positions, cfg, last) and not last:  # a target pass: show it
            yield ContinuousProgress(step=step, n_done=done, latents=state.tokens.clone(), known=~state.unknown,
                                     halt=halt)
            if halt.stopped:
                break
    yield ContinuousProgress(step=step, n_done=done, latents=state.tokens, known=~state.unknown,
                             stats=_finish(state.stats, B, done, start), halt=halt)


def _finish(stats: ContinuousStats, batch_size: int, done: int, start: float) -> ContinuousStats:
    """Per-row totals (every row takes part in every pass; `done` tokens each) and the wall clock."""
    stats.new_tokens = torch.full((batch_size,), done, dtype=torch.long)
    stats.steps = torch.full((batch_size,), stats.target_forwards, dtype=torch.long)
    stats.timings["total"] = time.perf_counter() - start
    if isinstance(stats.residual_tries, list):  # speculative runs collect one piece per verification
        tries = stats.residual_tries
        stats.residual_tries = torch.cat(tries) if tries else torch.zeros(0, dtype=torch.long)
    for name, parts in (stats.log_ratio_terms or {}).items():
        stats.log_ratio_terms[name] = torch.cat(parts)
    return stats
