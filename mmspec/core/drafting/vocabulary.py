"""Draft vocabularies (VocabTrim, Goel et al. 2025; FR-Spec, Zhao et al. 2025): a drafter whose output head keeps
only a subset S of the target's vocabulary scores |S| logits instead of V, draws an index into S from its law over S
(renormalised there: zero outside S), and records that law as a V-wide row, zero outside S, so verification stays
exact with any S. Only the draft's cost and its acceptance change (it can never propose a token outside S).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def frequent_vocabulary(ranking: torch.Tensor | list[int], size: int, keep: Iterable[int] = ()) -> torch.Tensor:
    """S: the `size` first ids of `ranking` (token ids, most frequent first) and the ids in `keep` (EOS and other
    specials, which a corpus may hold too rarely to make the cut), sorted. [|S|] long."""
    ranking = torch.as_tensor(ranking, dtype=torch.long)
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= ranking.numel():
        raise ValueError(f"a draft vocabulary's size must be an int in [1, {ranking.numel()}], got {size!r}")
    kept = torch.as_tensor(list(keep), dtype=torch.long)
    return torch.cat([ranking[:size], kept]).unique()  # unique sorts


def widen(index: torch.Tensor, q: torch.Tensor, vocabulary: torch.Tensor,
          vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Draws over S as the target's tokens: index [...] long into S, q [..., |S|] the law they were drawn from ->
    (token ids [...] long, the law as [..., V] rows, zero outside S)."""
    wide = q.new_zeros(*q.shape[:-1], vocab_size)
    return vocabulary[index], wide.scatter_(-1, vocabulary.expand_as(q), q)
