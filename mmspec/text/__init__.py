"""The text engine: `speculative_generate` for any transformers causal LM (batch > 1, per-row acceptance), its chain
drafters (a small model, the target's early exit, n-gram prompt lookup) and draft-length schedules, its tree drafters
(dynamic and OPT-Tree trees of a draft model or the early exit, STAND's n-gram memory), and the per-row KV-cache
slots of transformers caches that let rows roll back independently and trees keep their accepted path. The acceptance
and tree rules are the core's.
"""

from mmspec.core.tree_growth import TreeShape
from mmspec.text.drafters import DraftLengthSchedule, LayerSkipDrafter, ModelDrafter, NGramDrafter, early_exit_view
from mmspec.text.generate import speculative_generate
from mmspec.text.speculation import TextSpeculation
from mmspec.text.stats import TextStats
from mmspec.text.tree_drafters import LayerSkipTreeDrafter, ModelTreeDrafter, StandDrafter

__all__ = ["DraftLengthSchedule", "LayerSkipDrafter", "LayerSkipTreeDrafter", "ModelDrafter", "ModelTreeDrafter",
           "NGramDrafter", "StandDrafter", "TextSpeculation", "TextStats", "TreeShape", "early_exit_view",
           "speculative_generate"]
