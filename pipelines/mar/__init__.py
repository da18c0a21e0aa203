"""MAR-style class-to-image pipeline over continuous tokens (diffusion head), plain or speculative."""

from mmspec.pipelines.mar.pipeline_mar import MARPipeline, MARPipelineOutput

__all__ = ["MARPipeline", "MARPipelineOutput"]
