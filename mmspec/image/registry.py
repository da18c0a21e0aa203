"""Image decoding components by name, so pipelines and the CLI take `decoding="sjd"` plus the component's settings
(`window=16`), including the flat spellings of LANTERN's settings (`acceptance="lantern", lantern_k=100`)."""

from __future__ import annotations

from mmspec.core.acceptance import Lantern, acceptance_from
from mmspec.core.component import DecodingComponent, component_from
from mmspec.image.decoding import AR
from mmspec.image.draft_model import DraftModel
from mmspec.image.jacobi import SJD
from mmspec.image.parallel import PJD
from mmspec.options import IMAGE_DECODINGS

# every name of mmspec.options.IMAGE_DECODINGS but "auto", which pipelines resolve (mmspec.image.policy)
DECODINGS: dict[str, type[DecodingComponent]] = {"ar": AR, "sjd": SJD, "draft": DraftModel, "pjd": PJD}


def image_acceptance(acceptance=None, lantern_k: int | None = None, lantern_delta: float | None = None,
                     lantern_lam: float | None = None):
    """The `acceptance=` object of the flat spellings: a rule object or name, and LANTERN's settings as
    `lantern_k` / `lantern_delta` / `lantern_lam` (which need `acceptance="lantern"`). None if nothing is given."""
    lantern = {"k": lantern_k, "delta": lantern_delta, "lam": lantern_lam}
    given = {key: value for key, value in lantern.items() if value is not None}
    if acceptance is None and not given:
        return None
    rule = acceptance_from("exact" if acceptance is None else acceptance, "image")
    if given and not isinstance(rule, Lantern):
        raise ValueError(f"{sorted('lantern_' + key for key in given)} only apply to acceptance='lantern', got "
                         f"acceptance={rule.name!r}")
    if given and isinstance(acceptance, Lantern):
        raise ValueError("give LANTERN's settings in Lantern(k=, delta=, lam=) or as lantern_*, not both")
    return Lantern(**given) if given else rule


def get_decoding(decoding, acceptance=None, lantern_k: int | None = None, lantern_delta: float | None = None,
                 lantern_lam: float | None = None, **options) -> DecodingComponent:
    """An image decoding component from an object, a saved config dict, or a name (see `DECODINGS`) and settings
    (e.g. `window=16` for "sjd"; LANTERN's flat spellings too). Settings left as None take the defaults."""
    if decoding == "auto":
        raise ValueError('decoding="auto" needs the model, device and batch size: pipelines resolve it, or call '
                         "mmspec.image.policy.DecodingPolicy.choose")
    rule = image_acceptance(acceptance, lantern_k, lantern_delta, lantern_lam)
    return component_from(decoding, DECODINGS, names=IMAGE_DECODINGS, acceptance=rule, **options)
