"""The shared speculative core: model-agnostic code used by every decoder (text, image, continuous, video).

The kernel, here: settings / registry / component (settings spelled once, methods and rules by name, the base of
decoding components; these import no torch), rules (the acceptance rules, one file each), model (the causal-model
protocol every decoder drives), probs (logits -> laws), drafts (the Draft record), verify / multidraft (the chain test
and multi-draft rules), speculation (the speculative round), progress (the run contract: what `run` yields), rng
(caller-owned and keyed randomness), stats (the stats every decoding returns), trees / tree_shape / tree_verify (the
DraftTree IR, tree shapes, their exact walk and the alpha* ceiling), codebook (a VQ codebook's geometry for relaxed
rules). Apart from it: `drafting/` (the drafting algorithms: a draft model's and a head's chains and trees, tree growth,
stops, lengths), `runtime/` (captured steps, device flags, measurements) and `training/` (a head's teacher-forced
predictions); the kernel imports none of them. It imports torch and the standard library only; names are exported
lazily, so importing a torch-free module of it loads no torch.
"""

from mmspec.core.lazy import lazy_exports

_EXPORTS = {
    "AcceptanceRule": "mmspec.core.rules.base",
    "DecodingComponent": "mmspec.core.component",
    "DecodingStats": "mmspec.core.stats",
    "Draft": "mmspec.core.drafts",
    "DraftTree": "mmspec.core.trees",
    "Progress": "mmspec.core.progress",
    "Exact": "mmspec.core.rules.exact",
    "GSD": "mmspec.core.rules.gsd",
    "Lantern": "mmspec.core.rules.lantern",
    "SamplingConfig": "mmspec.core.probs",
    "run_to_end": "mmspec.core.progress",
    "SpecStats": "mmspec.core.stats",
    "TreeShape": "mmspec.core.tree_shape",
    "Typical": "mmspec.core.rules.typical",
    "VerifyResult": "mmspec.core.verify",
    "process_logits": "mmspec.core.probs",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
