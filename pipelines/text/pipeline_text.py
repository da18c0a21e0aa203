"""Text completion with the core's speculative decoding (`mmspec.text.speculative_generate`) behind one call:
tokenizer, target causal LM, drafter by name, decoded completions, and which forward committed each token.

It serves the `mmspec text` command and the demo's text tab; library users who hold their own drafter call
`speculative_generate` directly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mmspec.options import TEXT_METHODS
from mmspec.pipelines.text.policy import TextMethodPolicy
from mmspec.text import speculative_generate
from mmspec.text.drafters import DraftLengthSchedule, LayerSkipDrafter, ModelDrafter, NGramDrafter
from mmspec.text.stats import TextStats


@dataclass(frozen=True)
class TokenPiece:
    """One generated token as text: `step` is the target forward (verification step) that committed it and
    `from_draft` whether it was an accepted draft token (else the target drew it)."""

    text: str
    step: int
    from_draft: bool


@dataclass
class TextPipelineOutput:
    """texts: the completions (new text only, special tokens skipped); sequences: [B, T + N] prompt ids then new ids,
    padded after EOS; pieces: per row, the new tokens as `TokenPiece`s (up to and including EOS); stats: counters."""

    texts: list[str]
    sequences: torch.Tensor
    pieces: list[list[TokenPiece]]
    stats: TextStats


class SpeculativeTextPipeline:
    r"""Speculative text completion with a transformers causal LM.

    Methods (`method=`): `"auto"` (the default) runs the fastest exact one for these models, this device, batch size
    and greedy or sampled decoding, timed on first use and cached (`mmspec.pipelines.text.policy`; `stats.chosen_by`
    says which and why); `"model"` drafts with `draft` (a small LM sharing the tokenizer), `"ngram"` with prompt
    lookup, `"layerskip"` with the target's first `exit_layer` layers, and `"ar"` is the baseline: the target's own
    `generate` with its KV cache, one token per forward.

    Examples:
        ```py
        >>> import torch
        >>> from mmspec import SpeculativeTextPipeline

        >>> pipe = SpeculativeTextPipeline.from_pretrained("pycode/target", draft="pycode/draft")
        >>> out = pipe("def fibonacci(n):\n", max_new_tokens=32)  # method="auto"
        >>> print(out.texts[0])
        >>> print(out.stats.table())
        ```
    """

    def __init__(self, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 draft: PreTrainedModel | None = None):
        if draft is not None and draft.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"draft vocabulary size {draft.config.vocab_size} does not match the target's "
                             f"{target.config.vocab_size}")
        self.target, self.tokenizer, self.draft = target, tokenizer, draft
        self.method_policy = TextMethodPolicy()

    @classmethod
    def from_pretrained(cls, target: str | Path, draft: str | Path | None = None,
                        dtype=None) -> SpeculativeTextPipeline:
        """From zoo names ("pycode/target") or local transformers folders; the draft is optional."""
        from mmspec.zoo import load_causal_lm

        target_model, tokenizer = load_causal_lm(target, dtype=dtype)
        draft_model = None if draft is None else load_causal_lm(draft, dtype=dtype)[0]
        return cls(target_model, tokenizer, draft_model)

    @property
    def methods(self) -> tuple[str, ...]:
        """The methods this pipeline can run (`"model"` needs a draft, `"layerskip"` an exit layer in the config)."""
        unavailable = {"model"} if self.draft is None else set()
        if getattr(self.target.config, "early_exit_layer", None) is None:
            unavailable.add("layerskip")
        return tuple(m for m in TEXT_METHODS if m not in unavailable)

    def drafter(self, method: str, confidence_threshold: float = 0.0, exit_layer: int | None = None,
                max_ngram: int = 3):
        """The `Drafter` of a speculative method."""
        if method == "model":
            if self.draft is None:
                raise ValueError("method='model' needs a draft model; this pipeline was built without one")
            return ModelDrafter(self.draft, confidence_threshold=confidence_threshold)
        if method == "layerskip":
            exit_layer = exit_layer or getattr(self.target.config, "early_exit_layer", None)
            if exit_layer is None:
                raise ValueError("method='layerskip' needs exit_layer: the target's config names no early_exit_layer")
            return LayerSkipDrafter(self.target, exit_layer, confidence_threshold=confidence_threshold)
        if method == "ngram":
            return NGramDrafter(max_ngram=max_ngram)
        raise ValueError(f"method must be one of {TEXT_METHODS}, got {method!r}")

    @torch.no_grad()
    def __call__(
        self,
        prompt: str | list[str],
        method: str = "auto",
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        acceptance: str = "exact",
        draft_length: int = 4,
        schedule: str = "constant",
        confidence_threshold: float = 0.0,
        exit_layer: int | None = None,
        max_ngram: int = 3,
        generator: torch.Generator | list[torch.Generator] | None = None,
    ) -> TextPipelineOutput:
        r"""Complete `prompt` (one or a batch, decoded together with per-row acceptance).

        temperature 0 is greedy (the output is then token for token the target's greedy output); `acceptance` is
        `"exact"` (lossless) or `"typical"` (lossy). `draft_length` / `schedule` (`"constant"` or `"heuristic"`) set
        how many tokens are drafted per step. `"ar"` samples with transformers' `generate`, seeded from the
        generator's initial seed (a stream of its own: its samples differ from the speculative ones, its law does not).
        """
        prompts = [prompt] if isinstance(prompt, str) else prompt
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
            raise TypeError(f"prompt must be a str or a non-empty list of str, got {type(prompt).__name__}")
        empty = [i for i, p in enumerate(prompts) if not p.strip()]
        if empty:
            raise ValueError(f"prompt {empty[0]} is empty (or only whitespace); give text to complete")
        if method != "auto" and method not in TEXT_METHODS:
            raise ValueError(f"method must be 'auto' or one of {TEXT_METHODS}, got {method!r}")
        chosen_by = None
        if method == "auto":
            if acceptance != "exact":
                raise ValueError("method='auto' chooses among the exact methods; name the method to use "
                                 f"acceptance={acceptance!r}")
            options = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                           draft_length=draft_length, schedule=schedule, confidence_threshold=confidence_threshold,
                           exit_layer=exit_layer, max_ngram=max_ngram)
            method, chosen_by = self.method_policy.choose(self, prompts, options)
        started = time.perf_counter()
        encoded = self.tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")  # as generate needs
        ids, mask = encoded["input_ids"], encoded["attention_mask"]
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        if method == "ar":
            sequences, stats = self._generate_ar(ids, mask, max_new_tokens, temperature, top_k, top_p, generator)
        else:
            sequences, stats = speculative_generate(
                self.target, ids, mask, drafter=self.drafter(method, confidence_threshold, exit_layer, max_ngram),
                acceptance=acceptance, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                top_p=top_p, draft_length=DraftLengthSchedule(draft_length, kind=schedule), eos_token_id=eos,
                pad_token_id=pad, generator=generator,
            )
        if chosen_by is not None:
            stats.chosen_by = chosen_by
            self.method_policy.record(method, len(prompts), temperature, int(stats.new_tokens.sum()),
                                      time.perf_counter() - started)
        stats.method = stats.method or method
        new = sequences[:, ids.shape[1] :]
        texts = self.tokenizer.batch_decode(new, skip_special_tokens=True)
        pieces = [self._pieces(new[b, : int(stats.new_tokens[b])], stats, b) for b in range(len(prompts))]
        return TextPipelineOutput(texts, sequences, pieces, stats)

    def _generate_ar(self, ids, mask, max_new_tokens, temperature, top_k, top_p, generator):
        """The baseline: transformers' `generate` (KV cache, one token per forward) and its counters."""
        if isinstance(generator, (list, tuple)):
            raise ValueError("method='ar' takes one generator: transformers' generate samples from the global RNG")
        sample = temperature > 0
        kwargs = dict(temperature=temperature, top_k=top_k, top_p=top_p) if sample else {}
        start = time.perf_counter()
        with torch.random.fork_rng(devices=[]):
            if generator is not None:
                torch.manual_seed(generator.initial_seed())
            sequences = self.target.generate(input_ids=ids, attention_mask=mask, do_sample=sample,
                                             max_new_tokens=max_new_tokens, pad_token_id=self.tokenizer.pad_token_id,
                                             **kwargs)
        new = sequences[:, ids.shape[1] :]
        eos = self.tokenizer.eos_token_id
        is_eos = new == eos if eos is not None else torch.zeros_like(new, dtype=torch.bool)
        new_tokens = torch.where(is_eos.any(-1), is_eos.long().argmax(-1) + 1, new.shape[1])
        N = new.shape[1]
        real = torch.arange(N) < new_tokens[:, None]
        stats = TextStats(target_forwards=N, prefill_forwards=1, steps=new_tokens - 1, new_tokens=new_tokens,
                          speculative=False, method="ar (transformers generate)",
                          acceptance_map=torch.where(real, torch.arange(N), -1), from_draft=torch.zeros_like(real))
        stats.timings["total"] = time.perf_counter() - start
        return sequences, stats

    def _pieces(self, new_ids: torch.Tensor, stats: TextStats, row: int) -> list[TokenPiece]:
        """Row `row`'s new tokens as text pieces: each token's text is what it adds to the decoded prefix (so
        multi-token characters and leading spaces come out right)."""
        pieces, previous = [], ""
        for i in range(new_ids.shape[0]):
            text = self.tokenizer.decode(new_ids[: i + 1], skip_special_tokens=True)
            pieces.append(TokenPiece(text[len(previous) :], int(stats.acceptance_map[row, i]),
                                     bool(stats.from_draft[row, i])))
            previous = text
        return pieces
