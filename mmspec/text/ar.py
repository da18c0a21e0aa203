"""Text AR, the baseline every text speedup is measured against: the target's own transformers `generate` (KV cache,
one token per forward) with its counters, seeded from the caller's generator."""

from __future__ import annotations

import contextlib
import time

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from mmspec.core.component import StepHook
from mmspec.core.rng import Generators
from mmspec.text.stats import TextStats


def new_token_counts(new: torch.Tensor, eos_token_id: int | None) -> torch.Tensor:
    """[B]: each row's new tokens up to and including its first EOS (all of `new` [B, N] when it has none)."""
    if eos_token_id is None:
        return torch.full(new.shape[:1], new.shape[1], dtype=torch.long, device=new.device)
    is_eos = new == eos_token_id
    return torch.where(is_eos.any(-1), is_eos.long().argmax(-1) + 1, new.shape[1])


class StepCriterion(StoppingCriteria):
    """transformers' `generate` calls its stopping criteria after every token: this one hands the tokens so far to a
    step hook and stops every row when the hook says so."""

    def __init__(self, on_step: StepHook, prompt_width: int, max_new_tokens: int, eos_token_id: int | None,
                 pad_token_id: int):
        self.on_step, self.prompt_width, self.max_new_tokens = on_step, prompt_width, max_new_tokens
        self.eos_token_id, self.pad_token_id = eos_token_id, pad_token_id

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        new = input_ids[:, self.prompt_width :]
        counts = new_token_counts(new, self.eos_token_id)
        ids = torch.full((new.shape[0], self.max_new_tokens), self.pad_token_id, dtype=torch.long, device=new.device)
        ids[:, : new.shape[1]] = torch.where(torch.arange(new.shape[1], device=new.device) < counts[:, None], new,
                                             self.pad_token_id)
        stop = self.on_step(new.shape[1] - 1, int(counts.min()), {"generated_ids": ids, "new_tokens": counts})
        return torch.full((new.shape[0],), bool(stop), dtype=torch.bool, device=new.device)


@torch.no_grad()
def generate_ar(target, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                max_new_tokens: int = 64, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                eos_token_id: int | None = None, pad_token_id: int | None = None, generator: Generators = None,
                on_step: StepHook | None = None) -> tuple[torch.Tensor, TextStats]:
    """`target.generate` (prompts [B, T], left-padded) with its counters: sequences [B, T + N] and TextStats. Sampling
    runs on the global RNG: without a generator it draws from it and advances it, so two calls differ; with one
    (one generator: transformers' sampler has no per-row generators) on a fork of it seeded with a draw of
    `generator`, so the caller's generator advances as with every other decoding and a seed repeats its sample."""
    if isinstance(generator, (list, tuple)):
        raise ValueError("decoding=AR() takes one generator: transformers' generate samples from the global RNG")
    sample = temperature > 0
    kwargs = dict(temperature=temperature, top_k=top_k, top_p=top_p) if sample else {}
    if on_step is not None:
        criterion = StepCriterion(on_step, input_ids.shape[1], max_new_tokens, eos_token_id, pad_token_id)
        kwargs["stopping_criteria"] = StoppingCriteriaList([criterion])
    start = time.perf_counter()
    # without a generator, draw from the global RNG and advance it (as torch and transformers do); with one, sample
    # on a fork of it seeded by the generator, which leaves the global RNG as it was
    with contextlib.nullcontext() if generator is None else torch.random.fork_rng(devices=[]):
        if generator is not None:
            torch.manual_seed(int(torch.randint(2**62, (1,), generator=generator, device=generator.device)))
        sequences = target.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=sample,
                                    max_new_tokens=max_new_tokens, pad_token_id=pad_token_id, **kwargs)
    new = sequences[:, input_ids.shape[1] :]
    new_tokens = new_token_counts(new, eos_token_id)
    N = new.shape[1]
    real = torch.arange(N, device=new.device) < new_tokens[:, None]
    stats = TextStats(target_forwards=N, prefill_forwards=1, steps=new_tokens - 1, new_tokens=new_tokens,
                      speculative=False, method="AR(): transformers' generate",
                      acceptance_map=torch.where(real, torch.arange(N, device=new.device), -1).cpu(),
                      from_draft=torch.zeros_like(real).cpu())
    stats.timings["total"] = time.perf_counter() - start
    return sequences, stats
