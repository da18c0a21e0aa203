"""Emu3-Gen text-to-image pipeline."""

from mmspec.pipelines.emu3.pipeline_emu3 import Emu3Pipeline

__all__ = ["Emu3Pipeline"]
