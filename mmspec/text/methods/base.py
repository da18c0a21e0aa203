"""The bases of the text decodings (see `mmspec.text.methods`): `TextDecoding`, and `TextDrafting` / `TreeDrafting`,
speculative decoding with a drafter of chains or of trees, which every built-in text drafter subclasses in a file of
its own, as a user's or a plugin's does. Mixins for the settings several drafters read (`ConfidenceStop`, `LooksUp`,
`ExitAdapter`) spell each of them once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from mmspec.core.component import DecodingComponent
from mmspec.core.kinds import SCHEDULES
from mmspec.core.rules.base import AcceptanceRule
from mmspec.core.rules.exact import Exact
from mmspec.core.settings import runtime, setting

if TYPE_CHECKING:
    from collections.abc import Iterator

    import torch

    from mmspec.text.rows import TextProgress

LEARNED = "learned"  # SpecDec++'s learned draft length: a stop rule of the draft model (`TextDraftModel`)


@dataclass(frozen=True)
class TextDecoding(DecodingComponent):
    """Base of the text decodings (see the package docstring)."""

    modality: ClassVar[str] = "text"
    described: ClassVar[str | None] = None  # a phrase for the CLI's and the demo's lists (None: the docstring's first)

    def run(self, target: Any, draft: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
            **options) -> Iterator[TextProgress]:
        """Generate after the prompts input_ids [B, T] (attention_mask [B, T]): a run (`mmspec.core.progress`) of
        `TextProgress`, the last one with the sequences and the stats. target: the target behind the model protocol
        (a `mmspec.adapters.CausalLMAdapter`; a transformers causal LM is wrapped in one); draft: the pipeline's
        draft LM, likewise, or None."""
        raise NotImplementedError(f"{type(self).__name__} must define run()")

    def needs_draft_model(self) -> bool:
        """Whether `run` reads the pipeline's draft LM (a pipeline without one does not offer this decoding)."""
        return False

    def make_drafter(self, target: Any, draft: Any = None):
        """The drafter `speculative_generate` asks (a new one per call: drafters hold per-batch state); `draft`: the
        pipeline's draft LM (None where it has none)."""
        raise NotImplementedError(f"{type(self).__name__} must define make_drafter()")

    def drafting(self, target: Any, draft: Any):
        """`make_drafter`, refused by name when it needs the draft LM and the pipeline has none."""
        if self.needs_draft_model() and draft is None:
            raise ValueError(f"decoding={self.name!r} needs a draft model; this pipeline has none")
        return self.make_drafter(target, draft)


@dataclass(frozen=True)
class TextDrafting(TextDecoding):
    """Base of a text drafter of chains that is a decoding of its own: speculative decoding whose drafts come from
    `make_drafter`, `draft_length` tokens a step (or a schedule's). A subclass declares its settings as fields, checks
    them in `check()` (calling this one), builds its drafter (a `mmspec.text.drafters.ChainDrafter`) in
    `make_drafter` and is registered with `register_decoding`: then the pipelines run it by object or name,
    `mmspec text --method NAME` takes it (with a flag per setting), the demo lists it, `decoding="auto"` times it
    among its candidates, and `save_pretrained` keeps it. One whose `make_drafter` reads the pipeline's draft LM says
    so in `needs_draft_model()` (a pipeline without one does not offer it)."""

    learns_length: ClassVar[bool] = False  # whether schedule 'learned' (a stop rule of its drafter) applies

    draft_length: int = setting(4, "tokens drafted per target forward (with a schedule: the first, and 'learned': "
                                "the most)", low=1)
    schedule: str = setting("constant", "draft length per step: 'constant', transformers' 'heuristic' (+2 after a "
                            "fully accepted draft, else -1), or SpecDec++'s 'learned' (method 'model': a row stops "
                            "once its acceptance head predicts a rejection likelier than stop_threshold; "
                            "draft_length is the most)", choices=(*SCHEDULES, LEARNED))
    acceptance: AcceptanceRule = Exact()

    def check(self) -> None:
        if self.schedule == LEARNED and not self.learns_length:
            raise ValueError(f"schedule='learned' is SpecDec++'s stop rule of drafter='model', not of "
                             f"drafter={self.name!r}")

    def run(self, target, draft, input_ids, attention_mask=None, **options):
        """`speculative_steps(target, input_ids, attention_mask, ...)` with this drafter, draft-length schedule and
        acceptance; `options` are its sampling and stopping arguments (max_new_tokens, temperature, top_k, top_p,
        eos_token_id, pad_token_id, generator) and how its steps run (graphs, block)."""
        from mmspec.core.drafting.lengths import DraftLengthSchedule
        from mmspec.text.generate import speculative_steps

        # SpecDec++'s learned length is the drafter's stop rule under a constant one
        kind = "constant" if self.schedule == LEARNED else self.schedule
        return speculative_steps(target, input_ids, attention_mask, drafter=self.drafting(target, draft),
                                 draft_length=DraftLengthSchedule(self.draft_length, kind=kind),
                                 acceptance=attached(self.acceptance, target), **options)


@dataclass(frozen=True)
class TreeDrafting(TextDecoding):
    """Base of a text drafter of trees (`make_drafter` returns a `mmspec.text.tree_drafters.TreeDrafter`): every
    node scored in one target forward with a tree mask, the tree walked by the exact rule for how its children were
    drawn, so `acceptance` stays exact."""

    acceptance: AcceptanceRule = Exact()

    def check(self) -> None:
        if not self.acceptance.lossless:
            raise ValueError(f"acceptance={self.acceptance.name!r} is for chain drafters; drafter={self.name!r} is "
                             "verified by exact tree rules")

    def run(self, target, draft, input_ids, attention_mask=None, **options):
        """`speculative_steps` with this drafter's trees (`options` as `TextDrafting.run`'s)."""
        from mmspec.text.generate import speculative_steps

        return speculative_steps(target, input_ids, attention_mask, drafter=self.drafting(target, draft),
                                 acceptance=self.acceptance, **options)


@dataclass(frozen=True)
class ConfidenceStop:
    """The confidence stop (HF's `assistant_confidence_threshold`; Kangaroo's double early exit)."""

    confidence_threshold: float = setting(0.0, "a row stops drafting after a token whose draft probability is below "
                                          "it (0 = never; Kangaroo's double early exit: 0.6)", low=0, high=1,
                                          high_open=True)


@dataclass(frozen=True)
class LooksUp:
    """Prompt lookup's n-gram length, for the drafters that look up."""

    max_ngram: int = setting(3, "the longest n-gram prompt lookup looks up", low=1)


@dataclass(frozen=True)
class ExitAdapter:
    """Kangaroo's exit adapter (one trained at several exits for S2D), which a pipeline supplies."""

    kangaroo_adapter: Any = runtime(supplied_by="kangaroo_adapter")

    def exit_adapter(self):
        if self.kangaroo_adapter is None:
            raise ValueError(f"drafter={self.name!r} needs an exit adapter: load a pipeline that has a "
                             "kangaroo_adapter, or pass kangaroo_adapter=<KangarooAdapter>")
        return self.kangaroo_adapter


def attached(acceptance: AcceptanceRule, target: Any) -> AcceptanceRule:
    """`acceptance`, its judge head (judge decoding's, `Judge(head=...)`) reading `target`'s features of the drafts."""
    from mmspec.adapters.causal_lm import as_causal_model

    head = getattr(acceptance, "head", None)
    if head is not None:
        head.attach(as_causal_model(target))
    return acceptance


def draft_vocabulary(target: Any, size: int):
    """VocabTrim's vocabulary for a drafter of `target` (its draft LM or a draft head): the `size` ids first in the
    target's `token_ranking` (`mmspec.zoo.train_vocabulary`) and its special tokens (EOS, padding, BOS)."""
    from mmspec.adapters.causal_lm import as_causal_model
    from mmspec.core.drafting.vocabulary import frequent_vocabulary

    target = as_causal_model(target)
    ranking = getattr(target, "token_ranking", None)
    if ranking is None:
        raise ValueError("draft_vocabulary needs the target's token ranking (its config's token_ranking): write it "
                         "with python -m mmspec.zoo.train_vocabulary --target <its folder>")
    if size > len(ranking):
        raise ValueError(f"draft_vocabulary={size} exceeds the target's vocabulary of {len(ranking)}")
    return frequent_vocabulary(ranking, size, keep=target.special_token_ids)
