"""LlamaGen-architecture AR text-to-image pipeline."""

from mmspec.pipelines.llamagen.pipeline_llamagen import LlamaGenPipeline
from mmspec.pipelines.pipeline_output import ARImagePipelineOutput

__all__ = ["ARImagePipelineOutput", "LlamaGenPipeline"]
