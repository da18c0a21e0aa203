"""`SJD(...)`: speculative Jacobi decoding with its exact successors (coupled redrafting, adaptive continuation,
frontier trees), exact or with a relaxed acceptance rule. The settings; the step is `mmspec.image.jacobi.JacobiStep`
(what each setting does, and why every exact mode keeps the model's law, is in its module docstring)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mmspec.core.registry import register_decoding
from mmspec.core.rules.base import AcceptanceRule
from mmspec.core.rules.exact import Exact
from mmspec.core.settings import setting
from mmspec.image.methods.base import ImageDecoding, TreeWidth

INITS = ("random", "horizontal", "vertical", "lookahead")  # how positions no window has reached are drafted
COUPLINGS = ("none", "maximal", "gumbel")  # how drafts are redrafted between iterations


def frontier_nodes(window: int, width: int, depth: int) -> int:
    """Slots of a window's forward with a frontier tree: the window's main chain, and at each of the first `depth`
    levels every node's `width` children but the main one (`mmspec.image.frontier.FrontierTree`)."""
    depth = min(depth, window - 1)
    return window + sum(width**level - 1 for level in range(1, depth + 1))


@register_decoding
@dataclass(frozen=True)
class SJD(TreeWidth, ImageDecoding):
    """Speculative Jacobi decoding, batched, with per-row acceptance. Exact for every setting with `Exact()`; a
    frontier tree (`tree_width` > 1, SJD-PAC's proactive drafting) needs an adapter with `forward_tree` /
    `keep_path` (LlamaGen's and the embedded models')."""

    name: ClassVar[str] = "sjd"
    window: int = setting(16, "tokens scored per target forward (1 = plain AR)", low=1)
    init: str = setting("horizontal", "how positions no window has reached are drafted", choices=INITS)
    coupling: str = setting("maximal", "how drafts are redrafted between iterations ('none': published SJD, "
                            "'maximal': MC-SJD = SJD-PAC's adaptive continuation)", choices=COUPLINGS)
    acceptance: AcceptanceRule = Exact()
    tree_width: int = setting(1, "candidates per position at the window's first tree_depth draft positions (a "
                              "frontier tree, exact; 1 = none)", low=1)
    tree_depth: int = setting(2, "draft positions with a frontier tree (read with tree_width > 1)", low=1)

    def check(self) -> None:
        self.check_tree()
        if self.tree and self.tree_depth >= self.window:
            raise ValueError(f"tree_depth must be < the window ({self.window}), got {self.tree_depth}")
        if not self.tree and self.tree_depth != SJD.tree_depth:
            raise ValueError(f"tree_depth is read only with tree_width > 1, got tree_depth={self.tree_depth} and "
                             f"tree_width=1")

    def reads(self, field: str) -> bool:
        return field != "tree_depth" or self.tree

    @property
    def forward_width(self) -> int:
        """Tokens one target forward scores per row: the window, or the frontier tree's nodes."""
        return frontier_nodes(self.window, self.tree_width, self.tree_depth) if self.tree else self.window

    def step(self, model, opening, sampling, generator, stats):
        from mmspec.image.jacobi import JacobiStep

        return JacobiStep(self, model, opening, sampling, generator, stats)
