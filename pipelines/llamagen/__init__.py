"""LlamaGen-architecture AR text-to-image pipeline."""

from pipelines.llamagen.pipeline_llamagen import LlamaGenPipeline
from pipelines.pipeline_output import ARImagePipelineOutput

__all__ = ["ARImagePipelineOutput", "LlamaGenPipeline"]
