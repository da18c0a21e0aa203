"""The shared speculative core: model-agnostic tensor code used by every decoder (text, image, continuous, video).

probs (logits -> laws), drafts (the Draft record), verify / multidraft (acceptance rules and their residuals), rng
(caller-owned and keyed randomness), stats (the stats every decoding returns). It imports torch only; the text engine
is `mmspec.text`.
"""

from mmspec.core.drafts import Draft
from mmspec.core.probs import SamplingConfig, process_logits
from mmspec.core.stats import SpecStats
from mmspec.core.verify import ACCEPTANCE_RULES, LOSSLESS_RULES, VerifyResult

__all__ = ["ACCEPTANCE_RULES", "LOSSLESS_RULES", "Draft", "SamplingConfig", "SpecStats", "VerifyResult", "process_logits"]
