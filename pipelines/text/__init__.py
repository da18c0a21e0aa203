"""Speculative text completion with a transformers causal LM (the core's `speculative_generate`)."""

from mmspec.pipelines.text.pipeline_text import SpeculativeTextPipeline, TextPipelineOutput, TokenPiece

__all__ = ["SpeculativeTextPipeline", "TextPipelineOutput", "TokenPiece"]
