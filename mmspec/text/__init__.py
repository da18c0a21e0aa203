"""The text engine: `speculative_generate` for any transformers causal LM (batch > 1, per-row acceptance), its drafters
(a small model, the target's early exit, n-gram prompt lookup) and draft-length schedules, and the per-row KV-cache
slots of transformers caches that let rows roll back independently. The acceptance rules are the core's.
"""

from mmspec.text.drafters import DraftLengthSchedule, LayerSkipDrafter, ModelDrafter, NGramDrafter, early_exit_view
from mmspec.text.generate import speculative_generate
from mmspec.text.speculation import TextSpeculation
from mmspec.text.stats import TextStats

__all__ = ["DraftLengthSchedule", "LayerSkipDrafter", "ModelDrafter", "NGramDrafter", "TextSpeculation", "TextStats",
           "early_exit_view",
           "speculative_generate"]
