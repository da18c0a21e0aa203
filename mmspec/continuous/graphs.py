"""The diffusion head's reverse chain as one graph: every sampler step of a token batch (S head calls and S Gaussian
steps, a few thousand small kernels) replayed at once, for AR and the draft steps of speculative decoding alike.

`sample(..., graphs)` takes what `sample_trajectory` takes (the head's conditions, x_T and the per-step noise, all
given: the chain draws no random numbers of its own) and returns the same trajectory. `SamplerGraphs` is a
`mmspec.core.runtime.capture.CallGraphs` keyed by the chain's shape (model, tokens n, CFG or not, schedule,
temperature): its first call runs eagerly, the second captures the chain on static input buffers, every later call
copies its inputs in and replays. On CUDA the graph is a `torch.cuda.CUDAGraph`; `cuda=False` replays a `TapeGraph`,
which runs the same replay path on a CPU (the tests decode with it and compare with the eager sampler).
"""

from __future__ import annotations

import torch

from mmspec.continuous.diffusion import DiffusionSchedule, Trajectory, sample_trajectory
from mmspec.core.runtime.capture import CallGraphs


class SamplerGraphs(CallGraphs):
    """The captured chains of a pipeline's MAR models, one per token-batch shape (see the module docstring)."""


def sample(model, z: torch.Tensor, z_uncond: torch.Tensor | None, guidance_scale: torch.Tensor,
           schedule: DiffusionSchedule, x_T: torch.Tensor, noise: torch.Tensor, temperature: float,
           graphs: SamplerGraphs | None = None) -> Trajectory:
    """The reverse chain of `model`'s diffusion head for n tokens conditioned on z [n, D] (z_uncond [n, D] or None,
    guidance_scale [n]) from x_T [n, C] with noise [S, n, C]: eager, or replayed from `graphs`."""
    def chain(z, z_uncond, guidance_scale, x_T, noise) -> tuple[torch.Tensor, ...]:
        trajectory = sample_trajectory(model.diffusion_head(z, z_uncond, guidance_scale), schedule, x_T, noise,
                                       temperature)
        return trajectory.x, trajectory.mean, trajectory.log_std

    inputs = (z, z_uncond, guidance_scale, x_T, noise)
    if graphs is None:
        return Trajectory(*chain(*inputs))
    # the schedule object is one per settings (`DiffusionSchedule.cosine`), and a captured chain keeps it alive
    key = (id(model), tuple(z.shape), tuple(x_T.shape), z_uncond is not None, id(schedule), float(temperature), z.dtype)
    return Trajectory(*graphs(key, chain, *inputs))
