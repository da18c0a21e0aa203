"""The run contract every decoding shares (`mmspec.core.progress`): `run` yields progress, the last one is the result,
`progress.stop()` ends the run where it stands and still gives a result, and closing a run early leaves nothing
behind (transformers' `generate`, which the text AR runs in a greenlet, included)."""

import pytest
import torch

from mmspec.continuous.diffusion import DiffusionSchedule
from mmspec.continuous.methods import AR as ContinuousAR
from mmspec.core.probs import SamplingConfig
from mmspec.core.progress import Halt, Progress, run_to_end
from mmspec.core.stats import SpecStats
from mmspec.image import AR as ImageAR
from mmspec.text.methods import AR as TextAR
from mmspec.text.methods import PromptLookup
from tests.image.table_model import TableImageModel
from tests.models.test_mar import tiny_mar
from tests.text.test_generate import prompts


def counting_run(n: int, log: list):
    """A run of n progresses that logs how far it got; the last is its result."""
    halt = Halt()
    for step in range(n):
        log.append(step)
        yield Progress(step=step, n_done=step + 1, halt=halt)
        if halt.stopped:
            break
    yield Progress(step=-1, n_done=-1, halt=halt)  # the result


def test_run_to_end_shows_every_progress_and_returns_the_result():
    log, shown = [], []
    result = run_to_end(counting_run(4, log), lambda progress: shown.append(progress.step))
    assert (log, shown, result.step) == ([0, 1, 2, 3], [0, 1, 2, 3, -1], -1)


def test_a_true_hook_stops_the_run_and_the_result_is_not_shown():
    log, shown = [], []
    result = run_to_end(counting_run(9, log), lambda progress: shown.append(progress.step) or progress.step == 2)
    assert (log, shown, result.step) == ([0, 1, 2], [0, 1, 2], -1)
    with pytest.raises(RuntimeError, match="not yielded by a running decoding"):
        Progress(step=0, n_done=0).stop()


def text_run(decoding, target, block=None, max_new_tokens=12):
    ids, mask = prompts(2)
    return decoding.run(target, None, ids, mask, max_new_tokens=max_new_tokens, temperature=0, pad_token_id=0,
                        block=block)


@pytest.mark.parametrize("decoding", [TextAR(), PromptLookup()], ids=["ar-generate", "ngram"])
def test_a_stopped_text_run_ends_every_row_where_it_stands(tiny_target, decoding):
    full = run_to_end(text_run(decoding, tiny_target, block=1))
    assert full.sequences is not None and full.stats is not None
    seen = []

    def stop_at_the_second(progress):
        assert progress.sequences is None and progress.stats is None  # only the result holds them
        seen.append(progress.new_tokens.clone())
        return len(seen) == 2

    stopped = run_to_end(text_run(decoding, tiny_target, block=1), stop_at_the_second)
    assert torch.equal(stopped.new_tokens.cpu(), seen[-1].cpu()) and int(stopped.new_tokens.max()) < 12
    n = stopped.sequences.shape[1]
    assert torch.equal(stopped.sequences, full.sequences[:, :n])  # greedy: what it has is the full run's start


def watched_generate(target, monkeypatch) -> list[str]:
    """Log when the target's `generate` starts and returns."""
    log, generate = [], target.generate

    def watched(**kwargs):
        log.append("started")
        out = generate(**kwargs)
        log.append("returned")
        return out

    monkeypatch.setattr(target, "generate", watched)
    return log


def test_closing_the_text_ar_run_early_ends_generate(tiny_target, monkeypatch):
    log = watched_generate(tiny_target, monkeypatch)
    run = text_run(TextAR(), tiny_target, block=2)
    first = next(run)
    assert first.n_done == 2 and log == ["started"]  # generate waits for the caller, on the caller's thread
    run.close()
    assert log == ["started", "returned"]


def test_an_error_in_generate_is_raised_to_the_caller(tiny_target, monkeypatch):
    def broken(**kwargs):
        raise RuntimeError("generate broke")

    monkeypatch.setattr(tiny_target, "generate", broken)
    with pytest.raises(RuntimeError, match="generate broke"):
        run_to_end(text_run(TextAR(), tiny_target))


def test_a_stopped_image_run_yields_nothing_more():
    model, shown = TableImageModel((2, 4), 6), []
    steps = ImageAR().run(model, torch.tensor([0, 1]), SamplingConfig(), torch.Generator().manual_seed(0),
                          SpecStats(), block=1)
    result = run_to_end(steps, lambda progress: shown.append(progress) or progress.n_done == 3)
    assert result is shown[-1] and result.n_done == 3 and (result.tokens[:, 3:] == -1).all()


def test_a_stopped_continuous_run_keeps_what_it_knows():
    model = tiny_mar()
    steps = ContinuousAR().run(model, None, torch.tensor([0, 1]), 4, DiffusionSchedule.cosine(3))
    shown = []
    result = run_to_end(steps, lambda progress: shown.append(progress) or True)
    assert len(shown) == 1 and result.stats is not None and shown[0].stats is None
    assert result.n_done == shown[0].n_done < model.config.seq_len
    assert torch.equal(result.known, shown[0].known) and int(result.known.sum()) == 2 * result.n_done
    assert (result.latents[~result.known] == 0).all() and torch.equal(result.latents, shown[0].latents)
