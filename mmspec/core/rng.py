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


def select_generators(generator: Generators, rows: torch.Tensor) -> Generators:
    """The generators of the rows kept when a batch narrows to `rows` ([B'] long): a list keeps its entries for those
    rows; None or one generator is shared, so it is unchanged."""
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    return [generator[i] for i in rows.tolist()]


def sample_seeds(generator: Generators, batch_size: int) -> torch.Tensor:
    """[B] long: one seed per sample from the caller's generator(s), for the keyed draws below; with a list of
    generators, sample b's seed comes from generator[b]. On the CPU whatever the generators' device (a CUDA generator
    draws on its own device)."""
    if generator is not None and not isinstance(generator, torch.Generator):
        return torch.cat([torch.randint(0, 2**31 - 1, (1,), generator=g, device=g.device).cpu() for g in generator])
    device = None if generator is None else generator.device
    return torch.randint(0, 2**31 - 1, (batch_size,), generator=generator, device=device).cpu()


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


# Counter-based draws: a value is a pure function of (seed, key...), so the same noise reaches every model and branch
# that asks for the same key, and draws that a run discards never shift the ones that follow. 32-bit integer hashing
# kept inside int64 without overflow: multiplications by 16-bit halves of the constants.
_MASK32 = 0xFFFFFFFF


def _mul32_(x: torch.Tensor, constant: int) -> torch.Tensor:
    """x = (x * constant) mod 2**32 in place, for x in [0, 2**32) (int64), without int64 overflow."""
    low, high = constant & 0xFFFF, constant >> 16
    high_part = (x * high).bitwise_and_(0xFFFF).bitwise_left_shift_(16)
    return x.mul_(low).add_(high_part).bitwise_and_(_MASK32)


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (Wellons' lowbias32) of x in [0, 2**32), elementwise, into a new tensor (in-place steps
    after the first: the hash is most of the cost of a keyed draw)."""
    x = x ^ (x >> 16)
    _mul32_(x, 0x7FEB352D)
    x.bitwise_xor_(x >> 15)
    _mul32_(x, 0x846CA68B)
    return x.bitwise_xor_(x >> 16)


def keyed_bits(seed: int | torch.Tensor, *keys: int | torch.Tensor) -> torch.Tensor:
    """32-bit hashes (int64 in [0, 2**32)) of (seed, *keys), broadcast over the keys' shapes; each key is an int or a
    long tensor (e.g. sample [B, 1, 1], position [1, L, 1], step [1, 1, S])."""
    h = _hash32(torch.as_tensor(seed, dtype=torch.long) & _MASK32)
    for key in keys:
        h = _hash32(h ^ (torch.as_tensor(key, dtype=torch.long, device=h.device) & _MASK32))
    return h


def keyed_uniform(seed: int | torch.Tensor, *keys: int | torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """U(0, 1) draws (never 0 or 1) keyed by (seed, *keys), broadcast over the keys' shapes."""
    return ((keyed_bits(seed, *keys).double() + 0.5) / 2.0**32).to(dtype)


def keyed_normal(seed: int | torch.Tensor, *keys: int | torch.Tensor, dim: int, dtype=torch.float32) -> torch.Tensor:
    """N(0, 1) draws of shape [*broadcast(seed, keys), dim] keyed by (seed, *keys, component), by Box-Muller in
    float64."""
    component = torch.arange(2 * dim)  # u1 keyed by component 2c, u2 by 2c + 1: one hash pass for both
    seed = torch.as_tensor(seed, dtype=torch.long)[..., None]
    keys = tuple(torch.as_tensor(k, dtype=torch.long)[..., None] for k in keys)
    u = keyed_uniform(seed, *keys, component, dtype=torch.float64)
    u1, u2 = u[..., 0::2], u[..., 1::2]
    return (torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * torch.pi * u2)).to(dtype)
