"""Sequence-level exactness on a real family's slot cache: a tiny random Emu3 (its end-of-line tokens forced in the
span), on the fixed-capacity slot cache its pipeline decodes on with CUDA (`on_slot_cache`, the steps uncaptured:
`tests/models/test_family_slot_cache.py` shows the captured steps decode the same tokens), decodes ROWS images of 2
rows of 2 codes for two prompts alternating in one batch, with CFG 2.0 and top-k 3, by AR, SJD, MC-SJD and SJD with
a frontier tree. Each prompt's sampled images are compared by a chi-square test with the exact joint law of the
family's AR sampling, enumerated over the top-k support on the eager cache. Mutation companions: a slot cache whose
rollback keeps the rejected drafts, and one whose tree step keeps the main chain's keys / values instead of the
accepted path's, must be rejected.
"""

import pytest
import torch

from mmspec.adapters.static_cache import StaticCausalLMAdapter
from mmspec.core.probs import SamplingConfig, process_logits
from mmspec.core.stats import SpecStats
from mmspec.image import AR, SJD
from mmspec.models.emu3 import Emu3Adapter
from mmspec.models.hf_image import PromptCondition, on_slot_cache
from tests.law import chi_square_p_value
from tests.models.test_emu3 import NEGATIVE, PROMPTS, tiny_emu3

H, W = 2, 2  # the span: 2 rows of 2 codes and an end-of-line
SAMPLING = SamplingConfig(temperature=1.0, top_k=3, guidance_scale=2.0)
ROWS = 8_000
# the mutation companions' rows: each mutant puts samples outside the law's support there (p = 0 at seeds 0 and 1)
MUTATION_ROWS = 3_000
HEAD_SCALE = 20.0  # sharpens the random laws and their dependence on the prefix (a wrong key then moves the top-k)
ALPHA = 1e-6
DECODINGS = {"ar": AR(), "sjd": SJD(3, "random", "none"), "mc_sjd": SJD(4, "horizontal", "maximal"),
             "frontier": SJD(4, "random", "maximal", tree_width=2)}


@pytest.fixture(scope="module")
def emu3():
    model = tiny_emu3().double()
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_SCALE)
    return model


def condition(prompts: torch.Tensor) -> PromptCondition:
    """The rows of `prompts` [R] (0 or 1: which of PROMPTS), each with the negative prompt."""
    return PromptCondition(PROMPTS[prompts], negative_ids=NEGATIVE[:1].expand(len(prompts), -1))


def exact_laws(adapter) -> dict[int, dict[tuple, float]]:
    """Per prompt: each image of nonzero probability (its local ids, line tokens included) -> its probability under
    AR sampling, grown position by position over the top-k support on the adapter's eager cache."""
    forced = adapter.forced_tokens.tolist()
    laws = {}
    for prompt in (0, 1):
        images = {(): 1.0}
        for position, token in enumerate(forced):
            if token >= 0:
                images = {image + (token,): mass for image, mass in images.items()}
                continue
            prefixes = list(images)
            with torch.no_grad():
                state, logits = adapter.prefill(condition(torch.full((len(prefixes),), prompt)), cfg=True)
                if position:
                    logits = adapter.forward(torch.tensor(prefixes), state)
            law = process_logits(logits.cond[:, -1].double(), SAMPLING, logits.uncond[:, -1].double())
            images = {prefix + (token,): images[prefix] * float(p)
                      for prefix, row in zip(prefixes, law, strict=True) for token, p in enumerate(row.tolist()) if p}
        laws[prompt] = images
    return laws


def p_values(tokens: torch.Tensor, laws) -> dict[int, float]:
    """Per prompt, the chi-square p-value of its rows' images against its exact law."""
    checks = {}
    for prompt, law in laws.items():
        index = {image: i for i, image in enumerate(law)}
        sampled = [index.get(tuple(row), -1) for row in tokens[prompt::2].tolist()]
        if min(sampled) < 0:  # an image the law gives no mass
            checks[prompt] = 0.0
            continue
        counts = torch.bincount(torch.tensor(sampled), minlength=len(law))
        checks[prompt] = chi_square_p_value(counts, torch.tensor(list(law.values()), dtype=torch.float64))
    return checks


def decode(model, decoding, rows: int = ROWS, seed: int = 0):
    adapter = on_slot_cache(Emu3Adapter(model, H, W), None)
    stats = SpecStats()
    with torch.no_grad():
        *_, last = decoding.run(adapter, condition(torch.arange(rows) % 2), SAMPLING,
                                torch.Generator().manual_seed(seed), stats)
    assert (last.n_committed == H * (W + 1)).all()
    return last.tokens, stats


@pytest.fixture(scope="module")
def laws(emu3):
    return exact_laws(Emu3Adapter(emu3, H, W))


# the default tier: MC-SJD, with both companions; the slow tier: AR, SJD and the frontier tree (the slot cache decodes
# what the eager cache decodes for each: tests/models/test_family_slot_cache.py)
@pytest.mark.parametrize("name", [name if name == "mc_sjd" else pytest.param(name, marks=pytest.mark.slow)
                                  for name in DECODINGS])
def test_the_slot_cache_path_samples_the_exact_law(emu3, laws, name):
    tokens, stats = decode(emu3, DECODINGS[name])
    checks = p_values(tokens, laws)
    assert min(checks.values()) > ALPHA, checks
    if name != "ar":
        assert 0 < stats.accepted < stats.drafted  # both branches of the acceptance test ran


@pytest.mark.parametrize("mutation, name", [("rollback", "mc_sjd"), ("keep_path", "frontier")])
def test_mutations_are_rejected(emu3, laws, monkeypatch, mutation, name):
    """rollback: the rejected drafts' keys / values stay visible; keep_path: the accepted alternate's are not moved
    onto the main chain's slots (the main chain's draft stays in their place)."""
    monkeypatch.setattr(StaticCausalLMAdapter, mutation, lambda self, state, other: None)
    tokens, _ = decode(emu3, DECODINGS[name], MUTATION_ROWS)
    assert min(p_values(tokens, laws).values()) < ALPHA
