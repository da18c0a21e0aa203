"""The contract of an image decoding component: `run(model, condition, sampling, generator, stats)` yields a
`mmspec.image.loop.DecodeStep` after every target forward, so a pipeline drives progress bars, callbacks and
interruption the same way for every method. The loop is written once (`mmspec.image.loop.decode`); a method supplies
the step it repeats (`step(...)`, an `mmspec.image.loop.ImageStep`) and how many tokens one target forward scores
per row (`forward_width`, what the default's cost model and the model's cache headroom read)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from mmspec.core.component import DecodingComponent
from mmspec.core.model import require
from mmspec.core.rules.exact import Exact
from mmspec.core.tree_shape import TreeShape, check_sized_tree, sized_tree

if TYPE_CHECKING:
    from mmspec.core.probs import SamplingConfig
    from mmspec.core.rng import Generators
    from mmspec.core.stats import SpecStats
    from mmspec.image.loop import DecodeStep, ImageStep, Opening


@dataclass(frozen=True)
class ImageDecoding(DecodingComponent):
    """Base of the discrete-token image decodings."""

    modality: ClassVar[str] = "image"
    capabilities: ClassVar[frozenset[str]] = frozenset()  # what it needs of a model adapter beyond the window forward

    @property
    def forward_width(self) -> int:
        """Tokens one target forward scores per row (1 for AR)."""
        return 1

    @property
    def max_window(self) -> int:
        """The widest window the model's state must make room for (`CausalModel.prefill`'s `max_window`)."""
        return self.forward_width

    def check_model(self, model: Any) -> None:
        """Refuse a model adapter this decoding cannot run on (before any forward): it must declare the capabilities
        the decoding needs."""
        require(model, self.capabilities, f"decoding={self.name!r}")

    def run(self, model: Any, condition: Any, sampling: SamplingConfig, generator: Generators,
            stats: SpecStats, block: int | None = None) -> Iterator[DecodeStep]:
        """Decode the image tokens of `condition`'s samples with `model` (a `DiscreteImageModel` adapter): one
        `DecodeStep` after the prefill and after every block of at most `block` iterations (None: as many as the rows
        are expected to need, up to 16, so the host reads the progress rarely; 1: after every target forward).
        The last one is the result (`mmspec.core.progress`); `progress.stop()`, or closing the iterator, ends the
        decoding where it stands (the stats count what was committed)."""
        from mmspec.image.loop import decode  # the components stay importable without torch

        return decode(self, model, condition, sampling, generator, stats, block)

    def step(self, model: Any, opening: Opening, sampling: SamplingConfig, generator: Generators,
             stats: SpecStats) -> ImageStep:
        """The step the loop repeats from `opening` (the prefill's state and first token) until every row is done."""
        raise NotImplementedError(f"{type(self).__name__} must define step()")


class TreeWidth:
    """For the decodings with a `tree_width` setting: above 1 they verify a tree, which needs an adapter with the
    "tree" capability, and the exact tree rules (so `acceptance` must be exact)."""

    tree_settings: ClassVar[str] = "tree_width > 1"  # the settings that make `tree` true, as errors name them

    @property
    def tree(self) -> bool:
        return self.tree_width > 1

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset({"tree"}) if self.tree else frozenset()

    def check_tree(self) -> None:
        if self.tree and not isinstance(self.acceptance, Exact):
            raise ValueError(f"{self.tree_settings} drafts a tree, verified by exact tree rules: acceptance must be "
                             f"Exact(), got {self.acceptance.describe()}")


# The help of the `tree_size` setting of the decodings whose drafter grows trees by size (`DraftedTree`)
TREE_SIZE_HELP = ("nodes of the drafter's tree, all scored in one target forward (exact): EAGLE-2's dynamic tree (the "
                  "most probable paths expanded, draft_length deep) or, with tree_rates, the positional one; 0 = the "
                  "full tree of tree_width, or a chain")


class DraftedTree(TreeWidth):
    """For the decodings whose drafter proposes a chain of `draft_length` tokens or a tree (`tree_shape`): with
    `tree_width` > 1 the full tree of that depth; with `tree_size` > 0 EAGLE-2's dynamic tree of that many nodes or,
    with `tree_rates`, the positional one (a draft model, a draft head: their `tree_size` and `tree_rates`
    settings)."""

    tree_settings: ClassVar[str] = "tree_width > 1 or tree_size > 0"

    @property
    def tree(self) -> bool:
        return self.tree_width > 1 or self.tree_size > 0

    def check(self) -> None:
        self.check_tree()
        if self.tree_size and self.tree_width > 1:
            raise ValueError("tree_width sets the full tree; with tree_size the tree is the dynamic (or, with "
                             "tree_rates, the positional) one")
        check_sized_tree(self.tree_size, self.draft_length, self.tree_rates, type(self).draft_length)

    def reads(self, field: str) -> bool:
        """Of the tree settings, those of the tree that runs (draft_length: not by a positional tree)."""
        unread = {"tree_size": self.tree_size == 0, "tree_rates": self.tree_rates is None,
                  "draft_length": self.tree_rates is not None, "tree_width": self.tree_size > 0}
        return not unread.get(field, False) and super().reads(field)

    def tree_shape(self) -> TreeShape:
        """The tree a round drafts (tree decodings): the sized one (`tree_size`), else every node tree_width
        children, draft_length levels."""
        if self.tree_size:
            return sized_tree(self.tree_size, self.draft_length, self.tree_rates)
        return TreeShape.full(self.draft_length, self.tree_width)

    @property
    def forward_width(self) -> int:
        """Tokens one target forward scores per row: the last committed token and the chain's or tree's drafts."""
        return 1 + (self.tree_shape().nodes if self.tree else self.draft_length)
