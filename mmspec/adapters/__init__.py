"""Implementations of the core's causal-model protocol (`mmspec.core.model.CausalModel`) for model libraries:
`CausalLMAdapter` serves every transformers causal LM — text targets and drafters, and the transformers image
families (Janus, Emu3, Lumina-mGPT) built on it in `mmspec.models`. LlamaGen's own GPT has its adapter beside its model
(`mmspec.models.llamagen.adapter`)."""

from mmspec.adapters.causal_lm import CausalLMAdapter, CausalLMState, Prompt, as_causal_model, cache_keyword

__all__ = ["CausalLMAdapter", "CausalLMState", "Prompt", "as_causal_model", "cache_keyword"]
