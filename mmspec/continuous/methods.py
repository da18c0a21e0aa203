"""The continuous-token (MAR-style) decodings, registered by name (`mmspec.core.registry.decodings("continuous")`):
`AR()`, the target alone on MAR's schedule, and `ContinuousSpeculation(...)`, continuous speculative decoding with a
draft MAR. Every continuous component runs the same way:

    component.run(target, draft, seeds, num_iter, schedule, labels, guidance_scale, temperature, plan, graphs,
                  cfg_schedule) -> Iterator[ContinuousProgress]

a run (`mmspec.core.progress`) whose last progress holds the tokens [B, L, C] (`latents`) and the stats.

The settings live here, without torch; running imports the engine (`mmspec.continuous.mar_decoding`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mmspec.continuous import paper  # noqa: F401  registers CSpD's rule, which ContinuousSpeculation takes
from mmspec.core.component import DecodingComponent
from mmspec.core.registry import register_decoding
from mmspec.core.rules.base import AcceptanceRule
from mmspec.core.rules.exact import Exact
from mmspec.core.settings import setting


@dataclass(frozen=True)
class ContinuousDecoding(DecodingComponent):
    """Base of the continuous-token decodings (see the module docstring)."""

    modality: ClassVar[str] = "continuous"

    def run(self, target, draft, seeds, num_iter, schedule, labels=None, guidance_scale=1.0, temperature=1.0,
            plan=None, graphs=None, cfg_schedule="linear"):
        """graphs: a `mmspec.continuous.graphs.SamplerGraphs` the diffusion heads' chains replay from (None: eager);
        cfg_schedule: "linear" or "constant" (`mmspec.continuous.mar_decoding.guidance_at`)."""
        from mmspec.continuous.mar_decoding import decode

        return decode(self, target, draft, seeds, num_iter, schedule, labels, guidance_scale, temperature, plan,
                      graphs, cfg_schedule)

    def steps(self, target, draft, labels, guidance_scale, schedule, temperature, num_iter, plan, state, graphs):
        """The step strategy the loop runs each MAR step with (`mmspec.continuous.mar_decoding`)."""
        raise NotImplementedError(f"{type(self).__name__} must define steps()")


@register_decoding
@dataclass(frozen=True)
class AR(ContinuousDecoding):
    """The target alone, on MAR's cosine schedule of `num_iter` steps (or the caller's `plan`)."""

    name: ClassVar[str] = "ar"

    def steps(self, target, draft, labels, guidance_scale, schedule, temperature, num_iter, plan, state, graphs):
        from mmspec.continuous.mar_decoding import TargetSteps

        return TargetSteps(target, labels, guidance_scale, schedule, temperature, graphs)


@register_decoding
@dataclass(frozen=True)
class ContinuousSpeculation(ContinuousDecoding):
    """A draft MAR drafts `gamma` steps per target pass; the first `prefill_ratio` of the steps are the target's own.
    acceptance: `Exact()` (the whole reverse trajectory accepted with min(1, P/Q): exact for the target on the
    coarsened schedule) or `Paper()` (CSpD's released rule, approximate), or its name. A rejected token's residual
    draws target proposals in batched rounds of `proposals_per_round`, at most `max_tries` in all (then it keeps the
    last one, counted in `stats.fallbacks`)."""

    name: ClassVar[str] = "speculative"
    gamma: int = setting(4, "draft steps per target pass", low=1)
    prefill_ratio: float = setting(0.0, "the share of the steps the target runs itself first", low=0, high=1,
                                   high_open=True)
    acceptance: AcceptanceRule = Exact()
    max_tries: int = setting(100, "target proposals per residual draw", low=1)
    proposals_per_round: int = setting(8, "target proposals per batched round", low=1)

    def steps(self, target, draft, labels, guidance_scale, schedule, temperature, num_iter, plan, state, graphs):
        from mmspec.continuous.mar_decoding import SpeculativeSteps

        if plan is not None:
            raise ValueError("plan applies to decoding=AR() only (speculative decoding runs the cosine schedule)")
        return SpeculativeSteps(target, draft, labels, guidance_scale, schedule, temperature, self, num_iter, state,
                                graphs)
