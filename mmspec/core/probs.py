"""Logits -> processed probabilities. The only place in mmspec where logits become a law.

Order (LlamaGen's): classifier-free guidance is combined on logits, then temperature, top-k and top-p are applied, all
in float32 (or the input's float64). The same function with the same `SamplingConfig` gives the target law p and the
draft law q, so the two are always processed identically.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """How logits become probabilities.

    temperature: 0 means greedy (a one-hot at the argmax); > 0 divides the logits.
    top_k: keep the k most likely tokens; 0 keeps all.
    top_p: keep the smallest set of most likely tokens whose mass reaches top_p (nucleus); 1.0 keeps all.
    guidance_scale: CFG scale applied as `uncond + (cond - uncond) * scale` when unconditional logits are given.
    cfg_interval: LlamaGen's `generate(cfg_interval=)`: image tokens 0 .. cfg_interval + 1 are guided, later ones
        take the conditional logits alone; -1 guides every token. Applied by the image decoders, which know the
        position each law is for (`mmspec.image.loop.probs_of`); `process_logits` guides whatever it is given.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    guidance_scale: float = 1.0
    cfg_interval: int = -1

    def __post_init__(self):
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
            raise TypeError(f"temperature must be a number, got {type(self.temperature).__name__}")
        if not 0 <= self.temperature < math.inf:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise TypeError(f"top_k must be an int, got {type(self.top_k).__name__}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = no top-k filtering), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.guidance_scale < math.inf:
            raise ValueError(f"guidance_scale must be a finite number >= 0, got {self.guidance_scale}")
        if isinstance(self.cfg_interval, bool) or not isinstance(self.cfg_interval, int):
            raise TypeError(f"cfg_interval must be an int, got {type(self.cfg_interval).__name__}")
        if self.cfg_interval < -1:
            raise ValueError(f"cfg_interval must be >= -1 (-1 = guide every token), got {self.cfg_interval}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def process_logits(
    logits: torch.Tensor, config: SamplingConfig, uncond_logits: torch.Tensor | None = None
) -> torch.Tensor:
    """Processed probabilities.

    logits: [..., V] conditional logits, any float dtype.
    uncond_logits: [..., V] unconditional logits for CFG, or None.
    Returns probabilities [..., V], float32 (float64 if the logits are float64), rows summing to 1. Never modifies its
    inputs.
    """
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    logits = logits.to(dtype)
    if uncond_logits is not None:
        uncond_logits = uncond_logits.to(dtype)
        logits = uncond_logits + (logits - uncond_logits) * config.guidance_scale
    if config.greedy:
        return one_hot(logits.argmax(-1), logits.shape[-1], dtype)
    logits = logits / config.temperature
    V = logits.shape[-1]
    if 0 < config.top_k < V:
        kth_largest = logits.topk(config.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    probs = logits.softmax(-1)
    if config.top_p < 1:
        sorted_probs, order = probs.sort(-1, descending=True)
        # Drop a token when the mass strictly before it already reaches top_p; the most likely token always stays.
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        drop_sorted = mass_before >= config.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def one_hot(ids: torch.Tensor, V: int, dtype: torch.dtype) -> torch.Tensor:
    """[..., V] rows of `dtype` with a 1 at each of ids [...] (in [0, V)). Unlike `torch.nn.functional.one_hot`, which
    checks the ids' range on the host, it never reads the device, so a captured step can hold it."""
    return (ids[..., None] == torch.arange(V, device=ids.device)).to(dtype)
