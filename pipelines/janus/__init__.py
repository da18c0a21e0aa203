"""Janus / Janus-Pro text-to-image pipeline."""

from pipelines.janus.pipeline_janus import JanusPipeline

__all__ = ["JanusPipeline"]
