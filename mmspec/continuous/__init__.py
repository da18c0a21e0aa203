"""Continuous-token (diffusion-head, MAR-style) AR: the head's sampler and speculative acceptance on its
trajectories."""

from mmspec.continuous.stats import ContinuousStats

__all__ = ["ContinuousStats"]
