"""GSD's groups (mmspec.core.rules.gsd): ranks around the draft under p, the probability and codebook filters, the
draft always in, non-code tokens alone, group size 1 = the exact rule; and the rule bound to a model's codebook."""

import pytest
import torch

from mmspec.core.drafts import Draft
from mmspec.core.rules.gsd import GSD, Grouping
from mmspec.core.verify import verify

P = torch.tensor([[[0.30, 0.25, 0.20, 0.15, 0.06, 0.04]]], dtype=torch.float64)  # [1, 1, 6]: rank = token id
Q = torch.tensor([[[0.10, 0.10, 0.50, 0.10, 0.10, 0.10]]], dtype=torch.float64)
# tokens 0..4 are codes; 1 points almost where 2 does, 3 is orthogonal to 2, 0 is 2 flipped; token 5 is no code
EMBEDDINGS = torch.nn.functional.normalize(torch.tensor(
    [[-1.0, -1.0], [1.0, 0.9], [1.0, 1.0], [1.0, -1.0], [0.9, 1.0], [0.0, 0.0]], dtype=torch.float64), dim=-1)
EMBEDDINGS[5] = 0


def group(draft: int, **settings) -> set[int]:
    tokens, inside = Grouping(EMBEDDINGS, GSD(**settings)).members(P, torch.tensor([[draft]]))
    return set(tokens[inside].tolist())


def test_groups_are_rank_neighbours_close_in_probability_and_in_the_codebook():
    assert group(2, group_size=3) == {1, 2}  # ranks 1..3; token 3 is orthogonal to 2 (cosine distance 1 > 0.5)
    assert group(2, group_size=3, d_threshold=1.5) == {1, 2, 3}
    # token 0 is 2 flipped (distance 2); token 4 points near 2 but its p is 0.14 away
    assert group(2, group_size=5, d_threshold=1.5, p_threshold=0.1) == {1, 2, 3}
    assert group(2, group_size=5, d_threshold=1.5, p_threshold=0.2) == {1, 2, 3, 4}
    assert group(2, group_size=3, p_threshold=0.01) == {2}
    assert group(0, group_size=3, d_threshold=2.0) == {0, 1}  # rank -1 lies past the top: dropped
    assert group(5, group_size=6, p_threshold=1.0, d_threshold=2.0) == {5}  # not a code: alone
    assert group(2, group_size=1, p_threshold=1.0, d_threshold=2.0) == {2}


def test_masses_and_the_exact_limit():
    drafts = torch.tensor([[2]])
    p_C, q_C = Grouping(EMBEDDINGS, GSD(group_size=3)).draft_masses(P, Q, drafts)
    assert torch.allclose(p_C, torch.tensor([[0.45]], dtype=torch.float64))  # p(1) + p(2)
    assert torch.allclose(q_C, torch.tensor([[0.60]], dtype=torch.float64))
    p_x, q_x = Grouping(EMBEDDINGS, GSD(group_size=1)).draft_masses(P, Q, drafts)
    assert p_x.item() == 0.20 and q_x.item() == 0.50


class Codebook:
    """A model adapter with a VQ codebook of the five codes above (token 5 is no code)."""

    codebook_token_ids = torch.arange(5)

    def codebook(self):
        return EMBEDDINGS[:5] * 3  # the rule normalises the code vectors


def test_the_rule_binds_to_the_model_s_codebook_and_verifies_with_it():
    p = torch.cat([P, P], 1)
    draft = Draft(tokens=torch.tensor([[2]]), lengths=torch.tensor([1]), q=Q)
    bound = GSD().bind(Codebook(), vocab_size=6)
    assert isinstance(bound, Grouping) and torch.allclose(bound.embeddings.double(), EMBEDDINGS)
    result = verify(p, draft, torch.Generator().manual_seed(0), bound)
    assert result.excess_acceptance is not None
    with pytest.raises(TypeError, match="needs a model with a VQ codebook"):
        GSD().bind(object(), vocab_size=6)


def test_settings_are_checked():
    with pytest.raises(ValueError, match="group_size must be >= 1"):
        GSD(group_size=0)
    with pytest.raises(ValueError, match="p_threshold"):
        GSD(p_threshold=1.5)
    with pytest.raises(ValueError, match="d_threshold"):
        GSD(d_threshold=3.0)
