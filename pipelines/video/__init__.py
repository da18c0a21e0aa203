"""Action-conditioned next-frame video pipeline with frame speculation (offline rollouts and interactive sessions)."""

from mmspec.pipelines.video.pipeline_nextframe import NextFramePipeline, NextFramePipelineOutput, NextFrameSession

__all__ = ["NextFramePipeline", "NextFramePipelineOutput", "NextFrameSession"]
