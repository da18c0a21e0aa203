"""The text decodings, registered by name (`mmspec.core.registry.decodings("text")`): `AR()`, the target alone, and
`TextSpeculation(drafter=...)`, speculative decoding with a drafter by name. Every text component runs the same way:

    component.run(target, draft, input_ids, attention_mask, *, max_new_tokens, temperature, top_k, top_p,
                  eos_token_id, pad_token_id, generator, on_step, graphs, block) -> (sequences [B, T + N], TextStats)

(graphs, block: how a speculative decoding's steps replay and how often it reads its progress,
`speculative_generate`; AR runs transformers' `generate`, which takes neither.)

The settings live here, without torch (the CLI's flags come from them); running imports the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from mmspec.core.component import DecodingComponent
from mmspec.core.kinds import HEAD_KINDS, SCHEDULES
from mmspec.core.registry import decodings, register_decoding
from mmspec.core.rules.base import AcceptanceRule
from mmspec.core.rules.exact import Exact
from mmspec.core.settings import runtime, setting, specs
from mmspec.core.tree_shape import TREE_RATES_HELP, TreeShape, check_sized_tree, sized_tree
from mmspec.text.kinds import (
    CHAIN_DRAFTERS,
    DESCRIBED,
    DRAFTERS,
    LEARNED,
    TREE_DRAFTERS,
    WITH_DRAFT_MODEL,
    check_tree_lookup,
)

if TYPE_CHECKING:
    import torch

    from mmspec.text.stats import TextStats


@dataclass(frozen=True)
class TextDecoding(DecodingComponent):
    """Base of the text decodings (see the module docstring)."""

    modality: ClassVar[str] = "text"

    def run(self, target: Any, draft: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
            **options) -> tuple[torch.Tensor, TextStats]:
        raise NotImplementedError(f"{type(self).__name__} must define run()")

    def needs_draft_model(self) -> bool:
        """Whether `run` reads the pipeline's draft LM (a pipeline without one does not offer this decoding)."""
        return False


@dataclass(frozen=True)
class TextDrafting(TextDecoding):
    """Base of a text drafter that is a decoding of its own: speculative decoding of chains whose drafts come from
    `make_drafter`. A subclass declares its settings as fields, checks them in `check()`, builds its drafter (a
    `mmspec.text.drafters.ChainDrafter`) in `make_drafter` and is registered with `register_decoding`: then the
    pipelines run it by object or name, `mmspec text --method NAME` takes it (with a flag per setting), the demo lists
    it, `decoding="auto"` times it among its candidates, and `save_pretrained` keeps it. One whose `make_drafter`
    reads the pipeline's draft LM says so in `needs_draft_model()` (a pipeline without one does not offer it)."""

    draft_length: int = setting(4, "tokens drafted per target forward", low=1)
    acceptance: AcceptanceRule = Exact()

    def make_drafter(self, target: Any, draft: Any = None):
        """The drafter `speculative_generate` asks (a new one per call: drafters hold per-batch state); `draft`: the
        pipeline's draft LM (None where it has none)."""
        raise NotImplementedError(f"{type(self).__name__} must define make_drafter()")

    def run(self, target, draft, input_ids, attention_mask=None, **options):
        """`speculative_generate` with this drafter, `draft_length` tokens a step and this acceptance rule."""
        from mmspec.text.generate import speculative_generate

        if self.needs_draft_model() and draft is None:
            raise ValueError(f"decoding={self.name!r} needs a draft model; this pipeline has none")
        return speculative_generate(target, input_ids, attention_mask, drafter=self.make_drafter(target, draft),
                                    draft_length=self.draft_length, acceptance=attached(self.acceptance, target),
                                    **options)


@register_decoding
@dataclass(frozen=True)
class AR(TextDecoding):
    """The baseline: the target's own `generate` (KV cache, one token per forward), seeded from a draw of the
    caller's generator (so successive calls with one generator differ, and a seed repeats a call). With captured
    steps (`graphs`, a pipeline on CUDA): AR through the speculative loop drafting nothing (`NoDrafter`), its steps
    replayed from CUDA graphs, sampling from the caller's generator itself — graphed AR, the baseline on a GPU."""

    name: ClassVar[str] = "ar"

    def run(self, target, draft, input_ids, attention_mask=None, graphs=None, block=None, **options):
        if graphs is not None:
            from mmspec.text.drafters import NoDrafter
            from mmspec.text.generate import speculative_generate

            sequences, stats = speculative_generate(target, input_ids, attention_mask, drafter=NoDrafter(),
                                                    graphs=graphs, block=block, **options)
            stats.method, stats.speculative = "AR(): graphed, through the speculative loop drafting nothing", False
            return sequences, stats
        from mmspec.text.ar import generate_ar

        return generate_ar(target, input_ids, attention_mask, **options)


@register_decoding
@dataclass(frozen=True)
class TextSpeculation(TextDecoding):
    """Draft, verify in one target forward, keep the accepted prefix: `speculative_generate` with a drafter by name.
    A setting its drafter does not read is refused, not ignored; `acceptance`: `Exact()` (lossless) or, for chains,
    `Typical(epsilon, delta)` (lossy), or its name."""

    name: ClassVar[str] = "speculative"
    drafter: str = setting("model", "; ".join(f"{name!r}: {what}" for name, what in DESCRIBED.items()),
                           choices=DRAFTERS)
    draft_length: int = setting(4, "tokens drafted per target forward", low=1, only={"drafter": CHAIN_DRAFTERS})
    schedule: str = setting("constant", "draft length per step: 'constant', transformers' 'heuristic' (+2 after "
                            "a fully accepted draft, else -1), or SpecDec++'s 'learned' (drafter 'model': a row stops "
                            "once its acceptance head predicts a rejection likelier than stop_threshold; "
                            "draft_length is the most)", choices=(*SCHEDULES, LEARNED),
                            only={"drafter": CHAIN_DRAFTERS})
    stop_threshold: float | None = setting(None, "schedule 'learned': stop once the predicted probability that a "
                                           "draft token so far is rejected exceeds it (default: the acceptance "
                                           "head's, chosen from the draft and target costs)", kind=float, low=0,
                                           high=1, low_open=True, high_open=True, only={"drafter": ("model",)})
    confidence_threshold: float = setting(0.0, "a row stops drafting after a token whose draft probability is below "
                                          "it (0 = never; Kangaroo's double early exit: 0.6)", low=0, high=1,
                                          high_open=True,
                                          only={"drafter": ("model", "layerskip", "kangaroo", "s2d")})
    exit_threshold: float = setting(0.3, "drafter 's2d': a row drafts the step through the shallowest exit whose "
                                    "top-1 probability for its first token reaches it (else the deepest; 0.3: the "
                                    "embedded pair's best)", low=0, high=1, low_open=True, only={"drafter": ("s2d",)})
    exit_layer: int | None = setting(None, "layer-skip drafts with the target's first N layers (default: the "
                                     "config's early_exit_layer)", kind=int, low=1, only={"drafter": ("layerskip",)})
    draft_vocabulary: int | None = setting(None, "VocabTrim: the draft LM's head scores only the N tokens the target "
                                           "writes most (its config's token_ranking) and the special tokens "
                                           "(default: all)", kind=int, low=1, only={"drafter": ("model",)})
    max_ngram: int = setting(3, "the longest n-gram prompt lookup looks up", low=1,
                             only={"drafter": ("ngram", "cascade", "tree")})
    lookup_after: int | None = setting(None, "a horizontal cascade: the draft LM drafts the first N positions (a "
                                       "tree's first N levels), prompt lookup the rest (default: every position "
                                       "from the draft LM; drafter 'cascade' has the cheaper lookup under it)",
                                       kind=int, low=1, only={"drafter": ("cascade", "tree")})
    tree_depth: int = setting(4, "levels of the draft model's full tree", low=1, only={"drafter": ("tree",)})
    tree_branching: int = setting(2, "children per node of the full tree", low=1, only={"drafter": ("tree",)})
    tree_rates: tuple[float, ...] | None = setting(
        None, "the rates at which walks accept a node's k-th child (a run's stats.child_acceptance): the fixed tree "
        "of tree_nodes nodes built for them", kind=tuple, only={"drafter": ("tree",)})
    tree_nodes: int = setting(30, "nodes of the tree built for tree_rates", low=1, only={"drafter": ("tree",)})
    acceptance: AcceptanceRule = Exact()
    acceptance_head: Any = runtime(supplied_by="acceptance_head", only={"schedule": (LEARNED,)})
    kangaroo_adapter: Any = runtime(supplied_by="kangaroo_adapter", only={"drafter": ("kangaroo", "s2d")})

    def check(self) -> None:
        if self.schedule == LEARNED and self.drafter != "model":
            raise ValueError(f"schedule='learned' is SpecDec++'s stop rule for drafter 'model', not "
                             f"{self.drafter!r}")
        if self.stop_threshold is not None and self.schedule != LEARNED:
            raise ValueError("stop_threshold applies with schedule='learned'")
        if self.schedule == LEARNED and self.draft_vocabulary is not None:
            raise ValueError("schedule='learned' reads the draft's full law: it does not take a draft_vocabulary")
        if self.schedule == LEARNED and self.confidence_threshold:
            raise ValueError("schedule='learned' and confidence_threshold are two stop rules: give one")
        if self.tree_rates is None:
            if self.tree_nodes != TextSpeculation.tree_nodes:
                raise ValueError("tree_nodes applies with tree_rates (a positional tree); the full tree is "
                                 "tree_depth x tree_branching")
        else:
            for setting_name in ("tree_depth", "tree_branching"):
                if getattr(self, setting_name) != getattr(TextSpeculation, setting_name):
                    raise ValueError(f"{setting_name} sets the full tree; with tree_rates the tree is the positional "
                                     f"one of tree_nodes nodes")
            try:
                self.tree_shape()
            except (TypeError, ValueError) as error:
                raise ValueError(f"tree_rates: {error}") from None
        if self.drafter == "tree" and self.lookup_after is None and self.max_ngram != TextSpeculation.max_ngram:
            raise ValueError("max_ngram applies to a tree with lookup_after (prompt lookup's levels)")
        if self.drafter == "tree":
            check_tree_lookup(self.lookup_after, self.tree_shape().depth)
        if (self.drafter == "cascade" and self.lookup_after is not None and self.schedule == "constant"
                and self.lookup_after >= self.draft_length):
            raise ValueError(f"lookup_after={self.lookup_after} must be below draft_length={self.draft_length}: the "
                             "positions after it are prompt lookup's (leave it unset for a vertical cascade only)")
        if self.drafter in TREE_DRAFTERS and not self.acceptance.lossless:
            raise ValueError(f"acceptance={self.acceptance.name!r} is for chain drafters; drafter={self.drafter!r} "
                             "is verified by exact tree rules")

    def reads(self, field: str) -> bool:
        """A setting is read by the drafters it names; of the tree's, the full tree's without tree_rates and
        tree_nodes with them."""
        if field in ("tree_depth", "tree_branching") and self.tree_rates is not None:
            return False
        if field == "tree_nodes" and self.tree_rates is None:
            return False
        if field == "stop_threshold" and self.schedule != LEARNED:
            return False
        if field == "max_ngram" and self.drafter == "tree" and self.lookup_after is None:
            return False
        return super().reads(field)

    @classmethod
    def accepts(cls, drafter: str, settings: dict) -> bool:
        """Whether `drafter` reads every one of `settings` (names of fields)."""
        fields = specs(cls)
        return all(fields[key].only is None or drafter in fields[key].only["drafter"]
                   for key in settings if key in fields)

    def needs_draft_model(self) -> bool:
        return self.drafter in WITH_DRAFT_MODEL

    def tree_shape(self) -> TreeShape:
        """The draft LM's tree (drafter "tree")."""
        if self.tree_rates is None:
            return TreeShape.full(self.tree_depth, self.tree_branching)
        return TreeShape.positional(self.tree_nodes, self.tree_rates)

    def make_drafter(self, target: Any, draft: Any = None):
        """The drafter `speculative_generate` asks (a new one per call: drafters hold per-batch state)."""
        from mmspec.text.drafters import (
            CascadeDrafter,
            KangarooDrafter,
            LayerSkipDrafter,
            ModelDrafter,
            NGramDrafter,
        )
        from mmspec.text.tree_drafters import ModelTreeDrafter, StandDrafter

        if self.drafter in WITH_DRAFT_MODEL and draft is None:
            raise ValueError(f"drafter={self.drafter!r} needs a draft model; this pipeline has none")
        if self.draft_vocabulary is not None:
            return ModelDrafter(draft, confidence_threshold=self.confidence_threshold,
                                vocabulary=draft_vocabulary(target, self.draft_vocabulary))
        if self.drafter == "model" and self.schedule == LEARNED:
            if self.acceptance_head is None:
                raise ValueError("schedule='learned' needs an acceptance head: load a pipeline that has an "
                                 "acceptance_head, or pass acceptance_head=<AcceptanceHead>")
            return ModelDrafter(draft, acceptance_head=self.acceptance_head, stop_threshold=self.stop_threshold)
        if self.drafter == "model":
            return ModelDrafter(draft, confidence_threshold=self.confidence_threshold)
        if self.drafter == "cascade":
            return CascadeDrafter(draft, max_ngram=self.max_ngram, lookup_after=self.lookup_after)
        if self.drafter == "tree":
            return ModelTreeDrafter(draft, self.tree_shape(), lookup_after=self.lookup_after, max_ngram=self.max_ngram)
        if self.drafter == "stand":
            return StandDrafter()
        if self.drafter in ("kangaroo", "s2d") and self.kangaroo_adapter is None:
            raise ValueError(f"drafter={self.drafter!r} needs an exit adapter: load a pipeline that has a "
                             "kangaroo_adapter, or pass kangaroo_adapter=<KangarooAdapter>")
        if self.drafter == "kangaroo":
            return KangarooDrafter(target, self.kangaroo_adapter, confidence_threshold=self.confidence_threshold)
        if self.drafter == "s2d":
            from mmspec.text.sorted_exits import SortedExitDrafter

            return SortedExitDrafter(target, self.kangaroo_adapter, exit_threshold=self.exit_threshold,
                                     confidence_threshold=self.confidence_threshold)
        if self.drafter == "layerskip":
            exit_layer = self.exit_layer or getattr(target.config, "early_exit_layer", None)
            if exit_layer is None:
                raise ValueError("drafter='layerskip' needs exit_layer: the target's config names no early_exit_layer")
            return LayerSkipDrafter(target, exit_layer, confidence_threshold=self.confidence_threshold)
        return NGramDrafter(max_ngram=self.max_ngram)

    def run(self, target, draft, input_ids, attention_mask=None, **options):
        """`speculative_generate(target, input_ids, attention_mask, ...)` with this drafter, draft length schedule
        and acceptance; `options` are its sampling and stopping arguments (max_new_tokens, temperature, top_k, top_p,
        eos_token_id, pad_token_id, generator, on_step) and how its steps run (graphs, block)."""
        from mmspec.core.draft_lengths import DraftLengthSchedule
        from mmspec.text.generate import speculative_generate

        if self.drafter in CHAIN_DRAFTERS:  # SpecDec++'s learned length is the drafter's stop rule under a constant one
            kind = "constant" if self.schedule == LEARNED else self.schedule
            options["draft_length"] = DraftLengthSchedule(self.draft_length, kind=kind)
        return speculative_generate(target, input_ids, attention_mask, drafter=self.make_drafter(target, draft),
                                    acceptance=attached(self.acceptance, target), **options)


def attached(acceptance: AcceptanceRule, target: Any) -> AcceptanceRule:
    """`acceptance`, its judge head (judge decoding's, `Judge(head=...)`) reading `target`'s features of the drafts."""
    head = getattr(acceptance, "head", None)
    if head is not None:
        head.attach(target)
    return acceptance


def draft_vocabulary(target: Any, size: int):
    """VocabTrim's vocabulary for a drafter of `target` (its draft LM or a draft head): the `size` ids first in the
    target's config's `token_ranking` (`mmspec.zoo.train_vocabulary`) and its special tokens (EOS, padding, BOS)."""
    from mmspec.core.vocabulary import frequent_vocabulary

    ranking = getattr(target.config, "token_ranking", None)
    if ranking is None:
        raise ValueError("draft_vocabulary needs the target's token ranking (its config's token_ranking): write it "
                         "with python -m mmspec.zoo.train_vocabulary --target <its folder>")
    if size > len(ranking):
        raise ValueError(f"draft_vocabulary={size} exceeds the target's vocabulary of {len(ranking)}")
    specials = [getattr(target.config, f"{name}_token_id", None) for name in ("eos", "pad", "bos")]
    flat = [i for s in specials if s is not None for i in ([s] if isinstance(s, int) else s)]
    return frequent_vocabulary(ranking, size, keep=flat)


@register_decoding
@dataclass(frozen=True)
class TextDraftHeads(TextDecoding):
    """Speculative decoding with a draft head on the target's own features (EAGLE or Hydra). EAGLE: one decoder
    layer, chains of any length or EAGLE-2's dynamic trees; Hydra: sequentially dependent MLP heads, at most their
    number of tokens a round. head: the head itself (pipelines supply the `kind` they ship: `eagle_head`,
    `hydra_head`; not saved)."""

    name: ClassVar[str] = "heads"
    auto_settings: ClassVar[frozenset] = frozenset({"draft_length", "acceptance"})  # what `"auto"` passes it
    kind: str = setting("eagle", "which head drafts: 'eagle' (one decoder layer over the target's features) or "
                        "'hydra' (sequentially dependent MLP heads)", choices=HEAD_KINDS)
    draft_length: int = setting(4, "tokens drafted per target forward (the dynamic tree's depth with tree_size > 0)",
                                low=1)
    tree_size: int = setting(0, "nodes of the head's tree, all scored in one target forward: EAGLE-2's dynamic tree "
                             "(the most probable paths expanded) or, with tree_rates, the positional one; 0 = a chain",
                             low=0)
    tree_rates: tuple[float, ...] | None = setting(None, TREE_RATES_HELP, kind=tuple)
    lookup_after: int | None = setting(None, "a horizontal cascade: the head drafts the first N positions (a "
                                       "tree's first N levels), prompt lookup the rest (default: every position "
                                       "from the head)", kind=int, low=1)
    draft_vocabulary: int | None = setting(None, "VocabTrim: a chain's head reads out only the N tokens the target "
                                           "writes most (its config's token_ranking) and the special tokens "
                                           "(default: all)", kind=int, low=1)
    acceptance: AcceptanceRule = Exact()
    head: Any = runtime(supplied_by="{kind}_head")

    def check(self) -> None:
        if self.tree_size and not self.acceptance.lossless:
            raise ValueError(f"acceptance={self.acceptance.name!r} is for chains; trees are verified by exact rules")
        check_sized_tree(self.tree_size, self.draft_length, self.tree_rates, TextDraftHeads.draft_length)
        depth = self.tree_shape().depth if self.tree_size else self.draft_length
        if self.lookup_after is not None and self.lookup_after >= depth:
            raise ValueError(f"lookup_after={self.lookup_after} must be below the draft's depth {depth} (draft_length, "
                             "or the tree's levels): the positions after it are prompt lookup's")
        if self.draft_vocabulary is not None and self.tree_size:
            raise ValueError("draft_vocabulary trims a chain's head: it needs tree_size=0")

    def reads(self, field: str) -> bool:
        """draft_length is not read by a positional tree, tree_rates only by one."""
        unread = {"tree_rates": self.tree_rates is None, "draft_length": self.tree_rates is not None}
        return not unread.get(field, False) and super().reads(field)

    def tree_shape(self) -> TreeShape:
        """The head's tree (tree_size > 0): positional with tree_rates, else EAGLE-2's dynamic one."""
        return sized_tree(self.tree_size, self.draft_length, self.tree_rates)

    def make_drafter(self, target: Any):
        from mmspec.text.head_drafters import HeadDrafter, HeadTreeDrafter

        if self.head is None:
            raise ValueError(f"decoding='heads' needs a draft head: load a pipeline that has a {self.kind}_head, or "
                             f"pass head=<{'EagleHead' if self.kind == 'eagle' else 'HydraHead'}>")
        if self.tree_size:
            return HeadTreeDrafter(target, self.head, self.tree_shape(), lookup_after=self.lookup_after)
        vocabulary = None if self.draft_vocabulary is None else draft_vocabulary(target, self.draft_vocabulary)
        return HeadDrafter(target, self.head, lookup_after=self.lookup_after, vocabulary=vocabulary)

    def run(self, target, draft, input_ids, attention_mask=None, **options):
        """`speculative_generate` with this head's drafter (`draft` is not read)."""
        from mmspec.text.generate import speculative_generate

        if not self.tree_size:
            options["draft_length"] = self.draft_length
        return speculative_generate(target, input_ids, attention_mask, drafter=self.make_drafter(target),
                                    acceptance=attached(self.acceptance, target), **options)


def text_component(name: str) -> TextDecoding:
    """The component a text method name stands for, at its defaults: a drafter's `TextSpeculation` (`"ngram"`), or
    the registered text decoding of that name (`"heads"`, `"ar"`, a registered `TextDrafting`)."""
    return TextSpeculation(drafter=name) if name in DRAFTERS else decodings("text")[name]()


def uses_draft_model(name: str) -> bool:
    """Whether text method `name` (or `"auto"`, which may choose any) drafts with the draft LM."""
    return name == "auto" or text_component(name).needs_draft_model()


def registered_drafters() -> dict[str, type[TextDrafting]]:
    """The registered `TextDrafting`s (a user's or a plugin's text drafters), by name."""
    return {name: cls for name, cls in decodings("text").items() if issubclass(cls, TextDrafting)}


def auto_settings() -> set[str]:
    """The settings `decoding="auto"` hands to its candidates: `TextSpeculation`'s, the heads' `auto_settings` and
    every registered `TextDrafting`'s."""
    drafters = registered_drafters().values()
    return {*specs(TextSpeculation), *TextDraftHeads.auto_settings, *(name for cls in drafters for name in specs(cls))}


def method_names() -> tuple[str, ...]:
    """What a text call can name as its decoding: each drafter of `TextSpeculation` (`"ngram"` = `TextSpeculation(
    drafter="ngram")`), every other registered text decoding but AR (`"heads"`, and any a user registers), then
    `"ar"`."""
    drafters = specs(TextSpeculation)["drafter"].choices
    others = [name for name in decodings("text") if name not in (AR.name, TextSpeculation.name)]
    return (*drafters, *others, AR.name)
