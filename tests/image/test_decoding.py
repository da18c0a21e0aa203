"""AR decoding through the adapter equals sampling from a full recompute of the model, with and without CFG."""

import pytest
import torch

from mmspec.core.probs import SamplingConfig, process_logits
from mmspec.core.registry import decodings
from mmspec.core.rng import sample
from mmspec.core.stats import SpecStats
from mmspec.image import AR, get_decoding
from mmspec.image.loop import PAD_ID
from mmspec.models.llamagen.adapter import LlamaGenAdapter, LlamaGenCondition
from tests.models.llamagen_tiny import TEXT_CONTEXT, tiny_transformer, tiny_vq


def recompute_sampling(model, states, mask, sampling: SamplingConfig, generators) -> torch.Tensor:
    """Reference sampler: every token from a full teacher-forced pass (no cache); CFG from a second pass with the
    unconditional prefix, for image tokens 0 .. cfg_interval + 1 only when `sampling.cfg_interval` >= 0 (LlamaGen's
    `generate`). Draws in the same order as the decoders (one uniform per row per token)."""
    B, N = states.shape[0], model.num_image_tokens
    tokens = torch.zeros(B, 0, dtype=torch.long)
    for i in range(N):
        padded = torch.cat([tokens, torch.zeros(B, 1, dtype=torch.long)], 1)  # the last input token is not read
        cond = model(padded, states, mask)[:, i]
        uncond = None
        if sampling.guidance_scale != 1.0 and (sampling.cfg_interval < 0 or i <= sampling.cfg_interval + 1):
            null = model.unconditional(B, states.device)
            uncond = model(padded, null, model.unconditional_mask(mask))[:, i]
        tokens = torch.cat([tokens, sample(process_logits(cond, sampling, uncond), generators)[:, None]], 1)
    return tokens


def run_ar(model, states, mask, sampling, generators):
    adapter = LlamaGenAdapter(model, tiny_vq())
    stats = SpecStats()
    steps = list(AR().run(adapter, LlamaGenCondition(states, mask), sampling, generators, stats))
    return steps, stats


@pytest.mark.parametrize(
    "sampling",
    [SamplingConfig(guidance_scale=1.0), SamplingConfig(temperature=0.8, top_k=5, guidance_scale=3.0),
     SamplingConfig(top_p=0.7, guidance_scale=0.5)],
    ids=["cfg-off", "cfg3-topk", "cfg0.5-topp"],
)
def test_ar_decoding_equals_full_recompute_sampling(sampling):
    model = tiny_transformer("t2i")
    g = torch.Generator().manual_seed(0)
    states = torch.randn(2, TEXT_CONTEXT, 16, generator=g, dtype=torch.float64)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    seeds = [11, 12]
    with torch.no_grad():
        expected = recompute_sampling(model, states, mask, sampling, [torch.Generator().manual_seed(s) for s in seeds])
        steps, stats = run_ar(model, states, mask, sampling, [torch.Generator().manual_seed(s) for s in seeds])
    assert torch.equal(steps[-1].tokens, expected)
    N = model.num_image_tokens
    # a DecodeStep after the prefill and after every block of iterations: 15 = 8 + 4 + 2 + 1 (no iteration wasted)
    assert [s.n_done for s in steps] == [1, 9, 13, 15, 16]
    assert stats.target_forwards == N and stats.tokens_per_target_forward == 1.0
    assert (steps[0].tokens[:, 1:] == PAD_ID).all() and steps[0].n_committed.tolist() == [1, 1]


def test_cfg_off_runs_no_unconditional_rows():
    """guidance_scale = 1 is the conditional model alone: the cache holds B rows, not 2B."""
    model = tiny_transformer("t2i")
    adapter = LlamaGenAdapter(model, tiny_vq())
    states = torch.randn(3, TEXT_CONTEXT, 16, dtype=torch.float64)
    state, logits = adapter.prefill(LlamaGenCondition(states), cfg=False)
    assert state.cache.k.shape[1] == 3 and logits.uncond is None


def test_get_decoding_names_the_choices():
    assert isinstance(get_decoding("ar"), AR)
    assert set(decodings("image")) == {"ar", "sjd", "draft", "heads", "pjd"}
    for name in ("jacobi", "auto"):  # "auto" is a pipeline's choice, not a component
        with pytest.raises(ValueError, match=r"decoding must be one of \('ar', 'sjd', 'draft', 'heads', 'pjd'\)"):
            get_decoding(name)
    with pytest.raises(ValueError, match=r"'ar'.*does not take \['window'\]"):
        get_decoding("ar", window=4)
    assert get_decoding("ar", window=None).name == "ar"  # None = the method's default
    with pytest.raises(TypeError, match="decoding"):
        get_decoding(3)
