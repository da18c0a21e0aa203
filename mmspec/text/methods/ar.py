"""`AR()`, `"ar"`: the target alone, the baseline every text speedup is measured against."""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass
from typing import ClassVar

from mmspec.core.registry import register_decoding
from mmspec.text.methods.base import TextDecoding


@register_decoding
@dataclass(frozen=True)
class AR(TextDecoding):
    """The baseline: the target's own `generate` (KV cache, one token per forward), seeded from a draw of the
    caller's generator (so successive calls with one generator differ, and a seed repeats a call). With captured
    steps (`graphs`, a pipeline on CUDA): AR through the speculative loop drafting nothing (`NoDrafter`), its steps
    replayed from CUDA graphs, sampling from the caller's generator itself — graphed AR, the baseline on a GPU."""

    name: ClassVar[str] = "ar"

    def run(self, target, draft, input_ids, attention_mask=None, graphs=None, block=None, **options):
        if graphs is None:
            from mmspec.text.ar import ar_steps

            return ar_steps(target, input_ids, attention_mask, block=block, **options)
        from mmspec.text.drafters import NoDrafter
        from mmspec.text.generate import speculative_steps

        return graphed(speculative_steps(target, input_ids, attention_mask, drafter=NoDrafter(), graphs=graphs,
                                         block=block, **options))


def graphed(steps):
    """The speculative loop's run drafting nothing, its result's stats named as AR's."""
    with closing(steps):
        for progress in steps:
            if progress.stats is not None:
                progress.stats.method = "AR(): graphed, through the speculative loop drafting nothing"
                progress.stats.speculative = False
            yield progress
