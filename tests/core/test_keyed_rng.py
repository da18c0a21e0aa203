import torch
from scipy import stats

from mmspec.core.rng import keyed_normal, keyed_uniform


def test_keyed_draws_depend_on_their_key_only():
    grid = keyed_normal(7, torch.arange(50)[:, None], torch.arange(40)[None, :], dim=8)  # [50, 40, 8]
    assert grid.shape == (50, 40, 8)
    assert torch.equal(keyed_normal(7, torch.tensor([13, 2]), torch.tensor([5, 39]), dim=8), grid[[13, 2], [5, 39]])
    assert torch.equal(keyed_normal(7, 13, 5, dim=8), grid[13, 5])
    assert not torch.equal(keyed_normal(8, 13, 5, dim=8), grid[13, 5])
    seeds = torch.tensor([7, 8])  # one seed per sample
    assert torch.equal(keyed_normal(seeds, 13, dim=8)[0], keyed_normal(7, 13, dim=8))


def test_keyed_normals_and_uniforms_have_their_laws():
    x = keyed_normal(0, torch.arange(4000)[:, None], torch.arange(50)[None, :], dim=2).flatten().double()
    assert abs(x.mean()) < 5 / len(x) ** 0.5 and abs(x.var() - 1) < 5 * (2 / len(x)) ** 0.5
    assert stats.kstest(x[:100_000].numpy(), "norm").pvalue > 1e-3
    u = keyed_uniform(1, torch.arange(200_000))
    assert 0 < u.min() and u.max() < 1 and stats.kstest(u.double().numpy(), "uniform").pvalue > 1e-3
    pairs = keyed_normal(0, torch.arange(100_000), dim=2)
    assert abs(torch.corrcoef(pairs.T)[0, 1]) < 5 / 100_000**0.5  # the components are independent
