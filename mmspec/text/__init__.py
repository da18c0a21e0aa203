"""The text engine: `speculative_generate` for any transformers causal LM (batch > 1, per-row acceptance; as a run of
`TextProgress`, `speculative_steps`), its chain drafters (a small model, the target's early exit with or without
Kangaroo's adapter, S2D's sorted exits, n-gram prompt lookup, their cascade) and draft-length schedules, online
distillation of the draft LM while it serves, its tree drafters (dynamic, OPT-Tree and positional trees of a draft model
or the early exit, STAND's n-gram memory), and the text decodings (`AR` and one per drafter, `mmspec.text.methods`).
Models run through the core's protocol (`mmspec.adapters.CausalLMAdapter`); the acceptance and tree rules are the
core's. Names are exported lazily, so the decodings' settings load without torch.
"""

from mmspec.core.lazy import lazy_exports

_EXPORTS = {
    "AR": "mmspec.text.methods",
    "TextSpeculation": "mmspec.text.methods",
    "TextDrafting": "mmspec.text.methods",
    "TreeDrafting": "mmspec.text.methods",
    "TextDraftHeads": "mmspec.text.methods",
    "HeadDrafter": "mmspec.text.head_drafters",
    "HeadTreeDrafter": "mmspec.text.head_drafters",
    "TextDecoding": "mmspec.text.methods",
    "ChainDrafter": "mmspec.text.drafters",
    "DraftLengthSchedule": "mmspec.core.drafting.lengths",
    "Drafter": "mmspec.text.drafters",
    "KangarooDrafter": "mmspec.text.drafters",
    "LayerSkipDrafter": "mmspec.text.drafters",
    "ModelDrafter": "mmspec.text.drafters",
    "NGramDrafter": "mmspec.text.drafters",
    "NoDrafter": "mmspec.text.drafters",
    "early_exit_view": "mmspec.adapters.views",
    "kangaroo_view": "mmspec.adapters.views",
    "OnlineDistillation": "mmspec.text.online",
    "SortedExitDrafter": "mmspec.text.sorted_exits",
    "LayerSkipTreeDrafter": "mmspec.text.tree_drafters",
    "ModelTreeDrafter": "mmspec.text.tree_drafters",
    "StandDrafter": "mmspec.text.tree_drafters",
    "TreeDrafter": "mmspec.text.tree_drafters",
    "TextStats": "mmspec.text.stats",
    "TreeShape": "mmspec.core.tree_shape",
    "speculative_generate": "mmspec.text.generate",
    "speculative_steps": "mmspec.text.generate",
    "TextProgress": "mmspec.text.rows",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
