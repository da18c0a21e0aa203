"""The shared speculative core: model-agnostic tensor code used by every decoder (text, image, video).

probs (logits -> laws), verify / multidraft (acceptance rules), drafts (Draft record, drafters, draft-length schedules),
cache (per-row KV rollback), stats (SpecStats), rng (caller-owned randomness), text (speculative_generate).
"""

from mmspec.core.drafts import Draft, DraftLengthSchedule, LayerSkipDrafter, ModelDrafter, NGramDrafter, early_exit_view
from mmspec.core.probs import SamplingConfig, process_logits
from mmspec.core.stats import SpecStats
from mmspec.core.text import speculative_generate
from mmspec.core.verify import ACCEPTANCE_RULES, LOSSLESS_RULES, VerifyResult

__all__ = [
    "ACCEPTANCE_RULES", "LOSSLESS_RULES", "Draft", "DraftLengthSchedule", "LayerSkipDrafter", "ModelDrafter",
    "NGramDrafter", "SamplingConfig", "SpecStats", "VerifyResult", "early_exit_view", "process_logits",
    "speculative_generate",
]
