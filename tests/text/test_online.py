"""Online speculative decoding (`mmspec.text.online.OnlineDistillation`): the draft learns the target's law from the
requests it serves, at the logit that predicted each recorded token (OSD's offset pitfall: the mutation that trains
the logit at the token's own index learns less than the right one and is rejected); an update lands only between
requests; and a stream whose draft has learned online still decodes the target's exact law (chi-square against the
exact joint law). The law cannot depend on which weights drafted: every draft records the law it was drawn from,
and the rule's and proposer's mutation companions (`test_generate_law`) cover a recorded law that is not it.
The same for draft heads (`OnlineHeadDistillation`, EAGLE and Hydra): they learn from the target's features at the
served tokens, the offset mutant (a label column one token late) learns less, and a head learned online keeps the
law."""

import threading

import pytest
import torch

from mmspec.text import online, speculative_generate
from mmspec.text.drafters import ModelDrafter
from mmspec.text.head_drafters import HeadDrafter
from mmspec.text.online import (
    OnlineDistillation,
    OnlineHeadDistillation,
    ServedRow,
    divergence,
    head_student_logits,
    student_logits,
)
from tests.conftest import tiny_llama
from tests.text.table_lm import TableLM, random_table
from tests.text.test_generate_law import ALPHA, EOS, PROMPT_MASK, PROMPTS, V, law_test
from tests.text.test_head_drafters import head


def drafter_of(target, draft):
    """A draft LM's chains, or a draft head's (`draft` bound to `target`)."""
    return HeadDrafter(target, draft) if hasattr(draft, "logits") else ModelDrafter(draft)


def serve(target, draft, learner, requests, rows=32, seed=0, max_new_tokens=8):
    """`requests` requests of `rows` rows each (the two law-test prompts), sampled at T = 1, recorded by
    `learner`; returns the last request's stats."""
    ids, mask = PROMPTS.repeat(rows // 2, 1), PROMPT_MASK.repeat(rows // 2, 1)
    for r in range(requests):
        learner.before_request()
        out, stats = speculative_generate(target, ids, mask, drafter=drafter_of(target, draft),
                                          max_new_tokens=max_new_tokens, temperature=1.0, draft_length=3,
                                          eos_token_id=EOS, pad_token_id=EOS,
                                          generator=torch.Generator().manual_seed(seed + r))
        learner.after_request(target, out, mask, stats)
    learner.wait()
    return stats


def mean_tv(draft, target, seed=100, rows=64, max_new_tokens=8):
    """Mean total variation between the draft's (a head's: at every depth) and the target's laws at every token of
    fresh target samples."""
    ids, mask = PROMPTS.repeat(rows // 2, 1), PROMPT_MASK.repeat(rows // 2, 1)
    out, stats = speculative_generate(target, ids, mask, drafter=drafter_of(target, draft),
                                      max_new_tokens=max_new_tokens, temperature=1.0, draft_length=3,
                                      eos_token_id=EOS, pad_token_id=EOS, generator=torch.Generator().manual_seed(seed))
    is_head = hasattr(draft, "logits")
    recorder = (OnlineHeadDistillation(target, draft, positions="all") if is_head
                else OnlineDistillation(draft, positions="all"))
    recorder.record(target, out, mask, stats)
    with torch.no_grad():
        rows = list(recorder.buffer)
        logits, target_logprobs = head_student_logits(draft, rows, 2) if is_head else student_logits(draft, rows)
    recorder.close()
    return float(divergence(logits, target_logprobs, "tvd"))


def test_divergences_match_their_definitions():
    g = torch.Generator().manual_seed(0)
    logits, target = torch.randn(6, 7, generator=g, dtype=torch.float64), torch.randn(6, 7, generator=g,
                                                                                     dtype=torch.float64)
    p, q = target.softmax(-1), logits.softmax(-1)
    target_logprobs = target.log_softmax(-1)
    assert torch.allclose(divergence(logits, target_logprobs, "fkl"), (p * (p / q).log()).sum(-1).mean().float())
    assert torch.allclose(divergence(logits, target_logprobs, "tvd"), (1 - torch.minimum(p, q).sum(-1)).mean().float())
    with pytest.raises(ValueError, match="divergence"):
        divergence(logits, target_logprobs, "jsd")


def test_the_loss_reads_the_logit_that_predicted_each_token():
    model = tiny_llama(vocab_size=V, hidden_size=16, num_layers=1)
    row = ServedRow(torch.tensor([0, 3, 1, 2, 4]), torch.tensor([3, 4]), torch.zeros(2, V))
    logits, _ = student_logits(model, [row])
    expected = model(input_ids=row.ids[None]).logits[0, [2, 3]]
    assert torch.allclose(logits, expected)


def offset_student_logits(model, rows):
    """Mutation (OSD's pitfall in a port): the logit at the recorded token's own index, not the one before it."""
    shifted = [ServedRow(torch.cat([r.ids, r.ids[-1:]]), r.positions + 1, r.target_logprobs) for r in rows]
    return student_logits(model, shifted)  # the appended token is never read: the logits are causal


def learned_tv():
    """(mean TV before, after, the learner) of a draft that served 12 requests learning online."""
    target, draft = TableLM(random_table(V, 0)), tiny_llama(vocab_size=V, hidden_size=16, num_layers=1, seed=1)
    before = mean_tv(draft, target)
    learner = OnlineDistillation(draft, every=1, steps=8, rows_per_step=32, lr=1e-2, positions="all",
                                 background=False)
    serve(target, draft, learner, requests=12)
    learner.close()
    return before, mean_tv(draft, target), learner


def test_online_drafting_learns_the_targets_law():
    before, after, learner = learned_tv()
    assert learner.updates == 12
    assert after < 0.6 * before, f"mean TV {before:.3f} -> {after:.3f}"


def test_offset_mutant_learns_less(monkeypatch):
    _, right, _ = learned_tv()
    monkeypatch.setattr(online, "student_logits", offset_student_logits)  # what the learner trains through
    _, shifted, _ = learned_tv()
    assert shifted > 1.5 * right, f"offset loss reached TV {shifted:.3f}, the right one {right:.3f}"


def test_an_update_lands_only_between_requests(monkeypatch):
    draft = tiny_llama(vocab_size=V, hidden_size=16, num_layers=1, seed=1)
    learner = OnlineDistillation(draft, every=1)
    release = threading.Event()

    def slow_update():
        release.wait()
        with torch.no_grad():
            for weight in learner.student.parameters():
                weight.add_(1.0)

    monkeypatch.setattr(learner, "_update", slow_update)
    served = [w.clone() for w in draft.parameters()]
    learner._running = learner._worker.submit(learner._update)
    assert not learner.before_request()  # the update still runs: the request goes ahead on the old weights
    release.set()
    learner._running.exception()  # finished, not swapped in: a request in flight keeps its weights
    assert all(torch.equal(a, b) for a, b in zip(served, draft.parameters()))
    assert learner.before_request() and learner.updates == 1
    assert all(torch.allclose(a + 1.0, b, atol=1e-6) for a, b in zip(served, draft.parameters()))  # via float32
    learner.close()


def head_learned_tv(kind):
    """(mean TV before, after) of a random `kind` head that served 12 requests learning online."""
    target, drafting = TableLM(random_table(V, 0)), head(kind)
    before = mean_tv(drafting, target)
    learner = OnlineHeadDistillation(target, drafting, every=1, steps=8, rows_per_step=32, lr=1e-2, positions="all",
                                     background=False)
    serve(target, drafting, learner, requests=12)
    learner.close()
    assert learner.updates == 12
    assert all(weight.grad is None for weight in target.parameters())  # the student reads them detached
    return before, mean_tv(drafting, target)


@pytest.mark.parametrize("kind", ["eagle", "hydra"])
def test_online_heads_learn_the_targets_law(kind):
    before, after = head_learned_tv(kind)
    assert after < 0.6 * before, f"mean TV {before:.3f} -> {after:.3f}"


def late_head_student_logits(model, rows, unroll):
    """Mutation: each recorded token's law paired with the head's prediction one column late (the pair of the token
    itself, not of the one before it)."""
    late = [ServedRow(r.ids, r.positions + 1, r.target_logprobs, r.features) for r in rows]
    return head_student_logits(model, late, unroll)


def test_online_head_offset_mutant_learns_less(monkeypatch):
    _, right = head_learned_tv("eagle")
    monkeypatch.setattr(online, "head_student_logits", late_head_student_logits)  # what the learner trains through
    _, late = head_learned_tv("eagle")
    assert late > 1.5 * right, f"offset loss reached TV {late:.3f}, the right one {right:.3f}"


def test_the_head_loss_reads_the_pair_before_each_token():
    """Depth 0 at a recorded token t: the head's prediction from the pair (x_{t-1}, f_{t-2}), as its drafting reads."""
    target, drafting = TableLM(random_table(V, 0)), head("eagle")
    OnlineHeadDistillation(target, drafting).close()  # binds the head to the target
    ids = torch.tensor([0, 3, 1, 2, 4])
    features = torch.randn(5, drafting.config.feature_size)
    row = ServedRow(ids, torch.tensor([3, 4]), torch.zeros(2, V), features)
    logits, _ = head_student_logits(drafting, [row], unroll=0)
    cache = tuple(torch.zeros(1, 1, 4, drafting.config.feature_size) for _ in range(2))
    causal = torch.ones(1, 1, 4, 4).tril().bool()
    hidden = drafting(ids[None, 1:], features[None, :-1], torch.arange(1, 5)[None], causal, cache,
                      torch.arange(4)[None])
    torch.testing.assert_close(logits, drafting.logits(hidden[0, [1, 2]]))


@pytest.mark.parametrize("draft_length,temperature,top_k", [pytest.param(3, 1.0, 0, marks=pytest.mark.slow),
                                                             (2, 0.8, 3)])
def test_a_draft_learned_online_keeps_the_targets_law(draft_length, temperature, top_k):
    target, draft = TableLM(random_table(V, 0)), tiny_llama(vocab_size=V, hidden_size=16, num_layers=1, seed=1)
    start = [w.clone() for w in draft.parameters()]
    learner = OnlineDistillation(draft, every=1, steps=4, lr=1e-2)  # in the background, as it serves
    serve(target, draft, learner, requests=4)
    assert learner.updates >= 1 and not all(torch.equal(a, b) for a, b in zip(start, draft.parameters()))
    p_value, stats = law_test(target, ModelDrafter(draft), temperature, top_k, draft_length=draft_length)
    assert p_value > ALPHA, f"output law differs from the target's (p = {p_value:.2e})"
    assert 0 < stats.accepted < stats.drafted
    learner.close()


def test_a_head_learned_online_keeps_the_targets_law():
    target, drafting = TableLM(random_table(V, 0)), head("eagle")
    learner = OnlineHeadDistillation(target, drafting, every=1, steps=4, lr=1e-2)  # in the background
    serve(target, drafting, learner, requests=4)
    assert learner.updates >= 1
    p_value, stats = law_test(target, HeadDrafter(target, drafting), 1.0, 0, draft_length=3)
    assert p_value > ALPHA, f"output law differs from the target's (p = {p_value:.2e})"
    assert 0 < stats.accepted < stats.drafted
    learner.close()


@pytest.mark.parametrize("option,value", [("every", 0), ("buffer", 1.5), ("lr", 0), ("divergence", "rkl"),
                                          ("positions", "rejected"), ("steps", True)])
def test_bad_options_are_refused_by_name(option, value):
    with pytest.raises(ValueError, match=option):
        OnlineDistillation(tiny_llama(vocab_size=V, hidden_size=16, num_layers=1), **{option: value})


def test_an_online_head_refuses_what_is_not_a_head():
    target = TableLM(random_table(V, 0))
    with pytest.raises(TypeError, match="head must be a draft head"):
        OnlineHeadDistillation(target, tiny_llama(vocab_size=V, hidden_size=16, num_layers=1))
    with pytest.raises(ValueError, match="unroll"):
        OnlineHeadDistillation(target, head("eagle"), unroll=-1)
