import pytest
import torch

from mmspec.pipelines.text import SpeculativeTextPipeline
from mmspec.zoo import TEXT_DRAFT, TEXT_TARGET


@pytest.fixture(scope="module")
def pipe():
    return SpeculativeTextPipeline.from_pretrained(TEXT_TARGET, draft=TEXT_DRAFT)


PROMPTS = ["def fibonacci(n):\n", "import os\n\nclass Config:\n"]


def test_greedy_methods_complete_like_the_target(pipe):
    """Greedy speculative completions equal the target's own greedy `generate`, batch of two prompts."""
    ar = pipe(PROMPTS, method="ar", max_new_tokens=40)
    assert ar.stats.tokens_per_target_forward == 1.0 and ar.stats.target_forwards == 40
    for method in ("model", "ngram", "layerskip"):
        out = pipe(PROMPTS, method=method, max_new_tokens=40)
        assert out.texts == ar.texts and torch.equal(out.sequences, ar.sequences)
        assert out.stats.target_forwards < 40


@pytest.mark.parametrize("method", ["ar", "model"])
def test_pieces_rebuild_the_completion_and_mark_accepted_drafts(pipe, method):
    out = pipe(PROMPTS, method=method, max_new_tokens=32, temperature=1.0, generator=torch.Generator().manual_seed(3))
    for row, pieces in enumerate(out.pieces):
        assert "".join(p.text for p in pieces) == out.texts[row]
        assert len(pieces) == int(out.stats.new_tokens[row])
        steps = [p.step for p in pieces]
        assert steps == sorted(steps)
    drafted = sum(p.from_draft for pieces in out.pieces for p in pieces)
    assert (drafted == 0) if method == "ar" else (0 < drafted <= out.stats.accepted)


def test_sampling_is_reproducible_per_generator(pipe):
    kwargs = dict(method="model", max_new_tokens=24, temperature=1.0)
    first = pipe(PROMPTS[0], generator=torch.Generator().manual_seed(0), **kwargs)
    again = pipe(PROMPTS[0], generator=torch.Generator().manual_seed(0), **kwargs)
    assert torch.equal(first.sequences, again.sequences)
    ar = [pipe(PROMPTS[0], method="ar", max_new_tokens=24, temperature=1.0,
               generator=torch.Generator().manual_seed(0)).sequences for _ in range(2)]
    assert torch.equal(*ar)


def test_clear_errors(pipe):
    with pytest.raises(ValueError, match="method must be 'auto' or one of"):
        pipe("x = 1", method="beam")
    with pytest.raises(TypeError, match="prompt"):
        pipe([], method="ngram")
    with pytest.raises(ValueError, match="one generator"):
        pipe("x = 1", method="ar", generator=[torch.Generator()])
    with pytest.raises(ValueError, match="needs a draft model"):
        SpeculativeTextPipeline(pipe.target, pipe.tokenizer)("x = 1", method="model")
    assert "model" not in SpeculativeTextPipeline(pipe.target, pipe.tokenizer).methods
