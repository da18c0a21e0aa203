"""The shared speculative core: model-agnostic tensor code used by every decoder (text, image, continuous, video).

probs (logits -> laws), drafts (the Draft record), acceptance (the rule settings `Exact()`, `Lantern(...)`,
`Typical(...)`), verify / multidraft (the rules and their residuals), component (the base of decoding components),
rng (caller-owned and keyed randomness), stats (the stats every decoding returns), trees / tree_growth /
tree_verify (the DraftTree IR, growing trees from a drafter's laws, their exact walk and the alpha* ceiling). It
imports torch only; the text engine is `mmspec.text`.
"""

from mmspec.core.acceptance import Acceptance, Exact, Lantern, Typical
from mmspec.core.drafts import Draft
from mmspec.core.probs import SamplingConfig, process_logits
from mmspec.core.stats import DecodingStats, SpecStats
from mmspec.core.tree_growth import TreeShape
from mmspec.core.trees import DraftTree
from mmspec.core.verify import VerifyResult

__all__ = ["Acceptance", "DecodingStats", "Draft", "DraftTree", "Exact", "Lantern", "SamplingConfig", "SpecStats",
           "TreeShape", "Typical", "VerifyResult", "process_logits"]
