"""Lumina-mGPT text-to-image pipeline."""

from mmspec.pipelines.lumina_mgpt.pipeline_lumina_mgpt import LuminaMGPTPipeline

__all__ = ["LuminaMGPTPipeline"]
