"""Random draws from caller-owned generators: one `torch.Generator`, or one per batch row.

Every draw in mmspec goes through here, so a seed reproduces a run exactly and a row's stream does not depend on the
other rows of its batch when the caller passes one generator per row.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

Generators = torch.Generator | Sequence[torch.Generator] | None


def check_generators(generator: Generators, batch_size: int, name: str = "generator") -> None:
    """Raise if `generator` is not None, a `torch.Generator`, or a list of `batch_size` of them."""
    if generator is None or isinstance(generator, torch.Generator):
        return
    if not isinstance(generator, Sequence) or not all(isinstance(g, torch.Generator) for g in generator):
        raise TypeError(f"{name} must be a torch.Generator or a list of them, got {type(generator).__name__}")
    if len(generator) != batch_size:
        raise ValueError(f"{name} is a list of {len(generator)} generators but the batch size is {batch_size}")


def uniform(shape: tuple[int, ...], generator: Generators, device: torch.device, dtype=torch.float32) -> torch.Tensor:
    """U[0, 1) draws of `shape`; with a list of generators, row b of dim 0 comes from generator[b]."""
    if generator is None or isinstance(generator, torch.Generator):
        return torch.rand(shape, generator=generator, device=device, dtype=dtype)
    # One draw per row: each row has its own generator (vLLM does the same); B is small, this is not a per-token loop.
    return torch.stack([torch.rand(shape[1:], generator=g, device=device, dtype=dtype) for g in generator])


def sample(probs: torch.Tensor, generator: Generators) -> torch.Tensor:
    """One token per law from `probs: [B, ..., V]` with a single uniform per law. Returns `[B, ...]` long; with a
    list of generators, row b's draws come from generator[b]."""
    return inverse_cdf(probs, uniform(probs.shape[:-1], generator, probs.device, probs.dtype))


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token at which each law's CDF passes u: probs [..., V], u [...] in [0, 1) -> [...] long.

    Zero-probability tokens are never drawn (the CDF is flat there and the search is right-sided); the law is exact up
    to the floating-point CDF. Rows need not be normalised.
    """
    cdf = probs.cumsum(-1)
    threshold = u.to(cdf.dtype)[..., None] * cdf[..., -1:]
    return torch.searchsorted(cdf, threshold, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)
