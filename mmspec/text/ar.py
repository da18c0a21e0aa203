"""Text AR, the baseline every text speedup is measured against: the target's own transformers `generate` (KV cache,
one token per forward) with its counters, seeded from the caller's generator."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import greenlet
import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from mmspec.adapters.causal_lm import as_causal_model
from mmspec.core.progress import Halt
from mmspec.core.rng import Generators
from mmspec.text.generate import stop_tokens
from mmspec.text.rows import TextProgress
from mmspec.text.stats import TextStats


def new_token_counts(new: torch.Tensor, eos_token_id: int | None) -> torch.Tensor:
    """[B]: each row's new tokens up to and including its first EOS (all of `new` [B, N] when it has none)."""
    if eos_token_id is None:
        return torch.full(new.shape[:1], new.shape[1], dtype=torch.long, device=new.device)
    is_eos = new == eos_token_id
    return torch.where(is_eos.any(-1), is_eos.long().argmax(-1) + 1, new.shape[1])


class Handoff(StoppingCriteria):
    """transformers' `generate` calls its stopping criteria after every token: every `every` tokens this one hands
    the tokens so far to the run (`ar_steps`, which runs `generate` in a greenlet: same thread, so nothing of the
    caller's thread-local state, such as autocast, the CUDA stream or torch's thread pool, changes) and takes its
    answer, whether every row stops."""

    def __init__(self, every: int, prompt_width: int, max_new_tokens: int, eos_token_id: int | None,
                 pad_token_id: int):
        self.every, self.prompt_width, self.max_new_tokens = every, prompt_width, max_new_tokens
        self.eos_token_id, self.pad_token_id = eos_token_id, pad_token_id

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        new = input_ids[:, self.prompt_width :]
        B, n = new.shape
        if n % self.every:
            return torch.zeros(B, dtype=torch.bool, device=new.device)
        counts = new_token_counts(new, self.eos_token_id)
        ids = torch.full((B, self.max_new_tokens), self.pad_token_id, dtype=torch.long, device=new.device)
        ids[:, :n] = torch.where(torch.arange(n, device=new.device) < counts[:, None], new, self.pad_token_id)
        fewest = int(torch.where(counts < n, self.max_new_tokens, counts).min())  # of the rows still going
        stop = greenlet.getcurrent().parent.switch((ids, counts, fewest, n))
        return torch.full((B,), stop, dtype=torch.bool, device=new.device)


def ar_steps(target, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
             max_new_tokens: int = 64, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             eos_token_id: int | None = None, pad_token_id: int | None = None, generator: Generators = None,
             block: int | None = None) -> Iterator[TextProgress]:
    """The target's own `generate` (a transformers causal LM or its `CausalLMAdapter`; prompts [B, T], left-padded) as a
    run (`mmspec.core.progress`): a `TextProgress` every `block` tokens (None: 16), the last one with the sequences [B,
    T + N] and the stats. Sampling runs on the global RNG: without a generator it draws from it and advances it, so two
    calls differ; with one (one generator: transformers' sampler has no per-row generators) on a fork of it seeded with
    a draw of `generator`, so the caller's generator advances as with every other decoding and a seed repeats its
    sample. `generate` runs in a greenlet that pauses at each progress until the caller asks for the next one."""
    if isinstance(generator, (list, tuple)):
        raise ValueError("decoding=AR() takes one generator: transformers' generate samples from the global RNG")
    if block is not None and (isinstance(block, bool) or not isinstance(block, int) or block < 1):
        raise ValueError(f"block must be an int >= 1 or None, got {block!r}")
    model = as_causal_model(target)
    if not callable(getattr(model, "generate", None)):
        raise TypeError(f"decoding=AR() runs the target's own generate: a transformers causal LM or its "
                        f"CausalLMAdapter, got {type(target).__name__}")
    pad_token_id = stop_tokens(model, eos_token_id, pad_token_id, input_ids.device)[1]
    handoff = Handoff(block or 16, input_ids.shape[1], max_new_tokens, eos_token_id, pad_token_id)
    sample = temperature > 0
    kwargs = dict(temperature=temperature, top_k=top_k, top_p=top_p) if sample else {}

    def run_generate() -> torch.Tensor:
        # without a generator, draw from the global RNG and advance it (as torch and transformers do); with one,
        # sample on a fork of it seeded by the generator, which leaves the global RNG as it was
        with contextlib.nullcontext() if generator is None else torch.random.fork_rng(devices=[]):
            if generator is not None:
                torch.manual_seed(int(torch.randint(2**62, (1,), generator=generator, device=generator.device)))
            return model.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=sample,
                                  max_new_tokens=max_new_tokens, pad_token_id=pad_token_id,
                                  stopping_criteria=StoppingCriteriaList([handoff]), **kwargs)

    start, halt, fewest = time.perf_counter(), Halt(), 0
    worker = greenlet.greenlet(run_generate)
    shown = worker.switch()  # generate's first handoff, or its sequences
    try:
        while not worker.dead:
            ids, counts, fewest, n = shown
            yield TextProgress(step=n - 1, n_done=fewest, generated_ids=ids, new_tokens=counts, halt=halt)
            shown = worker.switch(halt.stopped)
    finally:
        while not worker.dead:  # the caller closed the run while generate waits for an answer: stop it
            worker.switch(True)

    sequences = shown
    new = sequences[:, input_ids.shape[1] :]
    new_tokens = new_token_counts(new, eos_token_id)
    N = new.shape[1]
    real = torch.arange(N, device=new.device) < new_tokens[:, None]
    stats = TextStats(target_forwards=N, prefill_forwards=1, steps=new_tokens - 1, new_tokens=new_tokens,
                      speculative=False, method="AR(): transformers' generate",
                      acceptance_map=torch.where(real, torch.arange(N, device=new.device), -1).cpu(),
                      from_draft=torch.zeros_like(real).cpu())
    stats.timings["total"] = time.perf_counter() - start
    ids = torch.full((new.shape[0], max_new_tokens), pad_token_id, dtype=torch.long, device=new.device)
    ids[:, :N] = torch.where(real, new, pad_token_id)
    yield TextProgress(step=N - 1, n_done=fewest if halt.stopped else max_new_tokens, generated_ids=ids,
                       new_tokens=new_tokens, stats=stats, sequences=sequences, halt=halt)
