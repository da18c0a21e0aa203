import pytest
import torch

from mmspec.core.probs import SamplingConfig, process_logits
from mmspec.core.rng import check_generators, sample


def test_temperature_and_plain_softmax():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    torch.testing.assert_close(process_logits(logits, SamplingConfig(temperature=2.0)), torch.softmax(logits / 2, -1))


def test_temperature_zero_is_one_hot_argmax():
    probs = process_logits(torch.tensor([[0.1, 3.0, 2.0]]), SamplingConfig(temperature=0))
    assert probs.tolist() == [[0.0, 1.0, 0.0]]


def test_top_k_keeps_k_most_likely():
    probs = process_logits(torch.tensor([[1.0, 4.0, 3.0, 2.0]]), SamplingConfig(top_k=2))
    assert (probs[0, [0, 3]] == 0).all()
    torch.testing.assert_close(probs[0, [1, 2]], torch.softmax(torch.tensor([4.0, 3.0]), -1))


def test_top_p_keeps_smallest_nucleus():
    probs_in = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    probs = process_logits(probs_in.log(), SamplingConfig(top_p=0.8))
    torch.testing.assert_close(probs, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    probs = process_logits(probs_in.log(), SamplingConfig(top_p=0.81))  # needs the third token
    assert (probs[0, :3] > 0).all() and probs[0, 3] == 0
    probs = process_logits(probs_in.log(), SamplingConfig(top_p=0.1))  # the top token always stays
    assert probs.tolist() == [[1.0, 0.0, 0.0, 0.0]]


def test_cfg_is_combined_on_logits_before_temperature_and_top_k():
    cond, uncond = torch.tensor([[2.0, 1.0, 0.0]]), torch.tensor([[0.0, 1.0, 3.0]])
    config = SamplingConfig(temperature=0.5, top_k=2, guidance_scale=3.0)
    guided = uncond + (cond - uncond) * 3.0  # [6, 1, -9]
    expected = torch.softmax(torch.tensor([[6.0, 1.0, float("-inf")]]) / 0.5, -1)
    torch.testing.assert_close(process_logits(cond, config, uncond_logits=uncond), expected)
    assert guided.argmax() == 0


def test_inputs_are_not_modified_and_dtype():
    logits = torch.randn(2, 3, 10, dtype=torch.float16)
    before = logits.clone()
    probs = process_logits(logits, SamplingConfig(top_k=3, top_p=0.5))
    assert torch.equal(logits, before) and probs.dtype == torch.float32
    assert process_logits(logits.double(), SamplingConfig()).dtype == torch.float64
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 3))


@pytest.mark.parametrize(
    "kwargs,match",
    [(dict(temperature=-1), "temperature"), (dict(top_k=-2), "top_k"), (dict(top_p=0), "top_p"),
     (dict(top_p=1.01), "top_p"), (dict(guidance_scale=-1), "guidance_scale"),
     (dict(temperature=float("inf")), "temperature must be a finite number >= 0"),
     (dict(temperature=float("nan")), "temperature must be a finite number"),
     (dict(guidance_scale=float("inf")), "guidance_scale must be a finite number >= 0")],
)
def test_bad_sampling_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingConfig(**kwargs)
    with pytest.raises(TypeError, match="top_k"):
        SamplingConfig(top_k=2.5)


def test_sample_follows_probs_and_skips_zeros():
    from scipy.stats import chisquare

    probs = torch.tensor([0.5, 0.0, 0.2, 0.3]).expand(100_000, 4)
    counts = torch.bincount(sample(probs, torch.Generator().manual_seed(0)), minlength=4)
    assert counts[1] == 0
    assert chisquare(counts[[0, 2, 3]].numpy(), [50_000, 20_000, 30_000]).pvalue > 1e-5


def test_generator_list_length_is_checked():
    with pytest.raises(ValueError, match="2 generators but the batch size is 3"):
        check_generators([torch.Generator(), torch.Generator()], 3)
