"""The diffusion head's reverse chain as one graph: every sampler step of a token batch (S head calls and S Gaussian
steps, a few thousand small kernels) replayed at once, for AR and the draft steps of speculative decoding alike.

`SamplerGraphs.sample` takes what `sample_trajectory` takes (the head's conditions, x_T and the per-step noise, all
given: the chain draws no random numbers of its own) and returns the same trajectory. The first call of a shape
(model, tokens n, CFG or not, schedule, temperature) runs eagerly (on a side stream on CUDA: it warms the allocator),
the second captures the chain on static input buffers, and every later call copies its inputs in and replays. On
CUDA the graph is a `torch.cuda.CUDAGraph`; `cuda=False` replays a `mmspec.core.capture.TapeGraph`, which runs the
same replay path on a CPU (the tests decode with it and compare with the eager sampler).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Any

import torch

from mmspec.continuous.diffusion import DiffusionSchedule, Trajectory, sample_trajectory
from mmspec.core.capture import CudaGraph, TapeGraph

KEPT_SAMPLERS = 64  # captured chains kept (least recently used dropped first): one per token-batch shape


def sample(model, z: torch.Tensor, z_uncond: torch.Tensor | None, guidance_scale: torch.Tensor,
           schedule: DiffusionSchedule, x_T: torch.Tensor, noise: torch.Tensor, temperature: float,
           graphs: SamplerGraphs | None = None) -> Trajectory:
    """The reverse chain of `model`'s diffusion head for n tokens conditioned on z [n, D] (z_uncond [n, D] or None,
    guidance_scale [n]) from x_T [n, C] with noise [S, n, C]: eager, or replayed from `graphs`."""
    if graphs is None:
        return sample_trajectory(model.diffusion_head(z, z_uncond, guidance_scale), schedule, x_T, noise, temperature)
    return graphs.sample(model, z, z_uncond, guidance_scale, schedule, x_T, noise, temperature)


class SamplerGraphs:
    """The captured chains of a pipeline's MAR models (see the module docstring). cuda=False: `TapeGraph`s."""

    capture_static = True

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.seen: set[Any] = set()  # shapes sampled once (eagerly)
        self.captured: OrderedDict[Any, CapturedChain] = OrderedDict()

    def sample(self, model, z, z_uncond, guidance_scale, schedule, x_T, noise, temperature) -> Trajectory:
        key = (id(model), tuple(z.shape), tuple(x_T.shape), z_uncond is not None, id(schedule), float(temperature),
               z.dtype)
        chain = self.captured.get(key)
        if chain is not None:
            self.captured.move_to_end(key)
            return chain(z, z_uncond, guidance_scale, x_T, noise)
        inputs = dict(z=z, z_uncond=z_uncond, guidance_scale=guidance_scale, x_T=x_T, noise=noise)
        if key not in self.seen:  # a first call warms up eagerly
            self.seen.add(key)
            with self._side_stream():
                return sample(model, **inputs, schedule=schedule, temperature=temperature)
        chain = self.captured[key] = CapturedChain(self, model, schedule, temperature, inputs)
        while len(self.captured) > KEPT_SAMPLERS:
            self.captured.popitem(last=False)
        return chain.trajectory()

    def new_graph(self):
        """A graph with its own memory pool (chains replay in any order, so none may reuse another's memory)."""
        return CudaGraph(torch.cuda.graph_pool_handle(), []) if self.cuda else TapeGraph()

    @contextlib.contextmanager
    def _side_stream(self):
        if not self.cuda:
            yield
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            yield
        torch.cuda.current_stream().wait_stream(side)


class CapturedChain:
    """One chain captured on static buffers: `inputs` (copies of the first captured call's) and the trajectory
    tensors the graph writes."""

    def __init__(self, graphs: SamplerGraphs, model, schedule: DiffusionSchedule, temperature: float,
                 inputs: dict[str, torch.Tensor | None]):
        self.inputs = {name: None if t is None else t.clone() for name, t in inputs.items()}
        head = model.diffusion_head(self.inputs["z"], self.inputs["z_uncond"], self.inputs["guidance_scale"])
        captured: list[Trajectory] = []
        self.graph = graphs.new_graph()
        self.graph.capture(lambda: captured.append(
            sample_trajectory(head, schedule, self.inputs["x_T"], self.inputs["noise"], temperature)))
        self.outputs = captured[0]
        if not self.graph.executes_capture:  # a CUDA capture only records: run it for this call
            self.graph.replay()

    def __call__(self, z, z_uncond, guidance_scale, x_T, noise) -> Trajectory:
        for name, value in dict(z=z, z_uncond=z_uncond, guidance_scale=guidance_scale, x_T=x_T, noise=noise).items():
            if value is not None:
                self.inputs[name].copy_(value)
        self.graph.replay()
        return self.trajectory()

    def trajectory(self) -> Trajectory:
        """The last replay's trajectory, copied out of the graph's buffers (the next replay overwrites them)."""
        return Trajectory(*(t.clone() for t in (self.outputs.x, self.outputs.mean, self.outputs.log_std)))
