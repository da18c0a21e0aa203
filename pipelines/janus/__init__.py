"""Janus / Janus-Pro text-to-image pipeline."""

from mmspec.pipelines.janus.pipeline_janus import JanusPipeline

__all__ = ["JanusPipeline"]
