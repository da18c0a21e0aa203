"""The text decodings, registered by name (`mmspec.core.registry.decodings("text")`): importing this package registers
the built-in ones. `AR()` is the target alone; every drafter is a decoding of its own, one file each: chains
(`TextDrafting`: `"model"`, `"ngram"`, `"layerskip"`, `"cascade"`, `"kangaroo"`, `"s2d"`), trees (`TreeDrafting`:
`"tree"`, `"stand"`) and the draft heads (`"heads"`); a user's or a plugin's drafter registers the same way. Every
text component runs the same way:

    component.run(target, draft, input_ids, attention_mask, *, max_new_tokens, temperature, top_k, top_p,
                  eos_token_id, pad_token_id, generator, graphs, block) -> Iterator[TextProgress]

with `target` and `draft` behind the model protocol (`mmspec.adapters.CausalLMAdapter`: what a component reads of
a model, its vocabulary, context, features, early exits and own `generate`, it reads through the adapter; `draft`
None where the pipeline has no draft LM): a run (`mmspec.core.progress`) whose last progress holds the sequences
[B, T + N] and the `TextStats` (graphs, block: how a speculative decoding's steps replay and how often it yields,
`speculative_steps`; AR runs the target's own `generate`, which replays no graphs).

The settings live here, without torch (the CLI's flags come from them); running imports the engine.
"""

from __future__ import annotations

from mmspec.core.registry import decodings
from mmspec.core.settings import specs

# isort: off
from mmspec.text.methods import ar, model, ngram, layerskip, cascade, kangaroo, s2d, tree, stand, heads  # noqa: F401
# isort: on
from mmspec.text.methods.ar import AR
from mmspec.text.methods.base import LEARNED, TextDecoding, TextDrafting, TreeDrafting, attached, draft_vocabulary
from mmspec.text.methods.cascade import Cascade
from mmspec.text.methods.heads import TextDraftHeads
from mmspec.text.methods.kangaroo import Kangaroo
from mmspec.text.methods.layerskip import LayerSkip
from mmspec.text.methods.model import TextDraftModel
from mmspec.text.methods.ngram import PromptLookup
from mmspec.text.methods.s2d import SortedExits
from mmspec.text.methods.stand import Stand
from mmspec.text.methods.tree import TextDraftTree

__all__ = ["AR", "LEARNED", "Cascade", "Kangaroo", "LayerSkip", "PromptLookup", "SortedExits", "Stand",
           "TextDecoding", "TextDraftHeads", "TextDraftModel", "TextDraftTree", "TextDrafting", "TextSpeculation",
           "TreeDrafting", "attached", "auto_settings", "built_in", "check_reads", "described", "draft_vocabulary",
           "drafter_named", "drafters", "chain_drafters", "method_names", "text_component", "uses_draft_model"]


def TextSpeculation(drafter: str = "model", **settings) -> TextDecoding:  # noqa: N802  the former class's spelling
    """The drafter named `drafter` with its settings: `TextSpeculation(drafter="ngram", max_ngram=2)` is
    `PromptLookup(max_ngram=2)` (a saved `{"name": "speculative", "drafter": ...}` config loads the same way)."""
    cls = drafter_named(drafter)
    check_reads(drafter, settings)
    return cls(**settings)


def drafter_named(drafter: str) -> type[TextDecoding]:
    """The registered drafter `drafter` (`TextSpeculation`'s spelling); ValueError listing them for another name."""
    registered = drafters()
    if drafter not in registered:
        raise ValueError(f"drafter must be one of {tuple(registered)}, got {drafter!r}")
    return registered[drafter]


def check_reads(name: str, settings) -> None:
    """ValueError naming the drafters that read a setting in `settings` (names) which text decoding `name` has not."""
    for key in settings:
        readers = [other for other, cls in decodings("text").items() if key in cls.settings()]
        if readers and name not in readers:
            raise ValueError(f"{key} applies to drafter {' / '.join(map(repr, readers))}, not {name!r}")


def drafters() -> dict[str, type[TextDecoding]]:
    """The registered text drafters of chains and trees (not the heads, which read the target's features), by name,
    built-ins first."""
    return {name: cls for name, cls in decodings("text").items() if issubclass(cls, (TextDrafting, TreeDrafting))}


def chain_drafters() -> dict[str, type[TextDrafting]]:
    """The registered drafters of chains (`TextDrafting`), by name: what `decoding="auto"` and the benchmark time."""
    return {name: cls for name, cls in decodings("text").items() if issubclass(cls, TextDrafting)}


def built_in(cls: type) -> bool:
    """Whether a registered text decoding is one of this package's (not a user's or a plugin's)."""
    return cls.__module__.startswith(f"{__name__}.")


def text_component(name: str) -> TextDecoding:
    """The registered text decoding `name` at its defaults (`"ngram"`, `"heads"`, `"ar"`, a user's)."""
    return decodings("text")[name]()


def uses_draft_model(name: str) -> bool:
    """Whether text method `name` (or `"auto"`, which may choose any) drafts with the draft LM."""
    return name == "auto" or text_component(name).needs_draft_model()


def auto_settings() -> set[str]:
    """The settings `decoding="auto"` hands to its candidates: every drafter of chains' and the heads'
    `auto_settings`."""
    return {*TextDraftHeads.auto_settings, *(name for cls in chain_drafters().values() for name in specs(cls))}


def method_names() -> tuple[str, ...]:
    """What a text call can name as its decoding: every registered text decoding, AR last."""
    return (*(name for name in decodings("text") if name != AR.name), AR.name)


def described(name: str) -> str:
    """Text method `name` in a phrase (its `described`, else its docstring's first sentence)."""
    cls = decodings("text")[name]
    return cls.described or " ".join((cls.__doc__ or name).split(". ")[0].split())
