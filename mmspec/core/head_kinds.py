"""The kinds of draft head on a target's own features (`mmspec.models.heads`), named here without torch so that the
settings of the decodings that draft with them can offer the choice: a pipeline ships them as `<kind>_head`; and the
trees a head drafts by size (`head_tree`), for the same settings in every modality."""

from __future__ import annotations

from collections.abc import Sequence

from mmspec.core.tree_shape import TreeShape

HEAD_KINDS = ("eagle", "hydra")


def head_tree(tree_size: int, draft_length: int, tree_rates: Sequence[float] | None) -> TreeShape:
    """A head's tree of `tree_size` nodes: EAGLE-2's dynamic tree, `draft_length` deep, or with `tree_rates` (the
    rates at which walks accept a node's k-th child) the positional tree for them, as deep as they make it."""
    if tree_rates is None:
        return TreeShape(nodes=tree_size, depth=draft_length)
    return TreeShape.positional(tree_size, tree_rates)


def check_head_tree(tree_size: int, draft_length: int, tree_rates: Sequence[float] | None,
                    default_draft_length: int) -> None:
    """Raise a `ValueError` naming the setting when tree_rates comes without a tree_size, beside a draft_length that
    is not the default (a positional tree's depth follows from its rates), or is no rates a tree can be built for."""
    if tree_rates is None:
        return
    if not tree_size:
        raise ValueError("tree_rates builds a positional tree of tree_size nodes: set tree_size > 0")
    if draft_length != default_draft_length:
        raise ValueError("draft_length is the dynamic tree's depth; the positional tree's depth follows from "
                         "tree_rates")
    try:
        head_tree(tree_size, draft_length, tree_rates)
    except (TypeError, ValueError) as error:
        raise ValueError(f"tree_rates: {error}") from None
