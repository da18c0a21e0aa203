"""Chi-square goodness of fit of sampled outcomes against an exact law (shared by the sequence-law tests)."""

import torch
from scipy.stats import chi2


def chi_square_p_value(counts: torch.Tensor, law: torch.Tensor) -> float:
    """counts: [K] observed outcomes per cell; law: [K] exact probabilities of the same cells (summing to 1).

    Cells with expected count < 5 are pooled into one; any sample in a zero-probability cell gives p = 0.
    """
    counts, law = counts.double(), law.double()
    expected = law * counts.sum()
    if counts[expected == 0].sum() > 0:
        return 0.0
    small, big = (expected > 0) & (expected < 5), expected >= 5
    observed = torch.cat([counts[big], counts[small].sum()[None]])
    expected = torch.cat([expected[big], expected[small].sum()[None]])
    observed, expected = observed[expected > 0], expected[expected > 0]
    statistic = ((observed - expected) ** 2 / expected).sum().item()
    return float(chi2.sf(statistic, len(observed) - 1))
