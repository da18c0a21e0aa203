"""Teacher-forced predictions of a draft head on a target's features, for the heads' training in the zoo
(`mmspec.zoo.train_heads`) and their online learning while they serve (`mmspec.text.online`).

A batch is R rows of L pairs (x_{j+1}, f_j): each token with the target's feature before it. An EAGLE head is
unrolled (EAGLE-3's training-time test): step s reads its own step s - 1 predictions, as drafting at depth s + 1
does; a Hydra head's head k reads the true tokens after its root. Heads are duck-typed (a Hydra head has
`num_heads`), so this module needs no model family.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Pairs(NamedTuple):
    """A teacher-forced batch of R rows and L pairs (x_{j+1}, f_j). tokens [R, L]; features [R, L, w]: what the head
    reads of the target before each token (its feature, w = d; beside it, for an EAGLE-3 head, the outputs of the
    layers it fuses, w = (k + 1) d); target_features [R, L, d]: the feature after it (what the head predicts); laws
    [R, L, V]: the target's law of the next token; positions [R, L]; guided_laws [R / 2, L, V] or None: images only,
    the law the decoding samples, classifier-free guidance over the conditional rows [0, R/2) and their
    unconditional twins [R/2, R). (Online learning leaves target_features and laws None: it reads its own.)"""

    tokens: torch.Tensor
    features: torch.Tensor
    target_features: torch.Tensor | None
    laws: torch.Tensor | None
    positions: torch.Tensor
    guided_laws: torch.Tensor | None = None


def is_hydra(head) -> bool:
    return hasattr(head, "num_heads")


def eagle_steps(head, batch: Pairs, unroll: int, noise: float) -> list[torch.Tensor]:
    """An EAGLE head's predictions [R, L, d] at each unrolled step 0 .. unroll (step s valid from column s on)."""
    tokens, features, positions = batch.tokens, head.fuse(batch.features), batch.positions
    R, L = tokens.shape
    c, device = head.config, tokens.device
    if noise:
        features = features + noise * (2 * torch.rand_like(features) - 1)
    cache = tuple(torch.zeros(R, c.n_head, (unroll + 1) * L, c.feature_size // c.n_head, device=device,
                              dtype=head.weight_dtype) for _ in range(2))
    column = torch.arange(L, device=device)
    slots = torch.arange((unroll + 1) * L, device=device)
    slot_step, slot_column = slots // L, slots % L
    outputs = []
    for s in range(unroll + 1):
        # column i at step s drafts depth s + 1: it sees the true pairs up to i - s, then steps 1..s on the diagonal
        seen = ((slot_step == 0) & (slot_column[None, :] <= column[:, None] - s)) | (
            (slot_step >= 1) & (slot_step <= s) & (slot_column[None, :] == column[:, None] - s + slot_step))
        seen |= (slot_step == s) & (slot_column[None, :] == column[:, None])  # itself
        hidden = head(tokens, features, positions, seen[None, None].expand(R, 1, L, -1), cache,
                      (s * L + column).expand(R, L))
        outputs.append(hidden)
        cache = tuple(x.clone() for x in cache)  # the next step writes its keys beside these, not over them
        features = torch.cat([features[:, :1], hidden[:, :-1]], 1)  # step s + 1 reads step s's predictions
    return outputs


def hydra_steps(head, batch: Pairs, noise: float) -> list[torch.Tensor]:
    """A Hydra head's head k predictions [R, L - k, d] (column i: root = the feature before token i, then tokens
    i .. i + k)."""
    tokens, features = batch.tokens, batch.features
    if noise:
        features = features + noise * (2 * torch.rand_like(features) - 1)
    L = tokens.shape[1]
    return [head(features[:, : L - k], tokens.unfold(1, k + 1, 1)) for k in range(head.num_heads)]


def unrolled_predictions(head, batch: Pairs, unroll: int, noise: float) -> list[torch.Tensor]:
    """Per depth, the head's predictions: an EAGLE head's unroll + 1 steps, a Hydra head's heads."""
    return hydra_steps(head, batch, noise) if is_hydra(head) else eagle_steps(head, batch, unroll, noise)


def aligned(head, predictions: list[torch.Tensor]) -> list[torch.Tensor]:
    """Depth d's predictions for the labels of columns d.. (EAGLE's step d is valid from column d on; Hydra's head
    d predicts, at column i, the label of column i + d): column j of depth d's holds the label of column j + d."""
    if is_hydra(head):
        return predictions
    return [hidden[:, d:] for d, hidden in enumerate(predictions)]
