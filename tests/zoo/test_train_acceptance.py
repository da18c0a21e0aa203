"""SpecDec++'s acceptance-head trainer and the token ranking of VocabTrim: their labels are the acceptance the rules
give, the commands run end to end on the embedded pair (a few samples and steps), and bad arguments fail before any
model loads."""

import json
import shutil

import pytest
import torch

from mmspec.models.acceptance import AcceptanceHead
from mmspec.zoo import ZOO_DIR, train_acceptance, train_vocabulary
from tests.conftest import tiny_llama


def test_labels_are_the_rules_acceptance():
    """The sampled label is min(1, p(x) / q(x)) at the drawn x, the greedy one whether the argmaxes agree; the
    statistics are those of the draft's law at the example's token."""
    target, draft = tiny_llama(vocab_size=16, seed=0, dtype=torch.float32), tiny_llama(vocab_size=16, seed=1,
                                                                                        dtype=torch.float32)
    samples = torch.randint(0, 16, (3, 9), generator=torch.Generator().manual_seed(0))
    data = train_acceptance.examples(target, draft, samples, torch.Generator().manual_seed(0))
    p = target(input_ids=samples).logits.float().softmax(-1)[:, :-1].flatten(0, 1)
    logits = draft(input_ids=samples).logits.float()[:, :-1].flatten(0, 1)
    q = logits.softmax(-1)
    greedy, sampled = data["tokens"].unbind(-1)
    assert torch.equal(greedy, q.argmax(-1))
    torch.testing.assert_close(data["labels"][:, 0], (p.argmax(-1) == greedy).float())
    ratio = p.gather(1, sampled[:, None]) / q.gather(1, sampled[:, None])
    torch.testing.assert_close(data["labels"][:, 1], ratio[:, 0].clamp(max=1))
    torch.testing.assert_close(data["statistics"][:, 1], AcceptanceHead.statistics(logits, sampled))
    assert data["features"].shape == (24, draft.config.hidden_size)


def test_the_threshold_rule_moves_with_the_cost():
    cheap, dear = train_acceptance.stop_threshold(0.6, 0.05), train_acceptance.stop_threshold(0.6, 0.3)
    assert 0.05 <= dear < cheap <= 0.95  # a dearer draft stops sooner


def test_the_commands_run_and_save(tmp_path):
    train_acceptance.main(["--samples", "6", "--held-out", "2", "--new-tokens", "8", "--sample-batch", "3",
                           "--steps", "2", "--batch-size", "8", "--hidden", "16", "--layers", "1",
                           "--out-dir", str(tmp_path / "out"), "--work-dir", str(tmp_path / "work")])
    folder = tmp_path / "out" / "acceptance_head"
    metrics = json.loads((folder / "training_metrics.json").read_text())
    head = AcceptanceHead.from_pretrained(folder)
    assert tuple(head.config.stop_threshold) == (metrics["stop_threshold"]["greedy"],
                                                 metrics["stop_threshold"]["sampled"])
    assert 0 <= metrics["sampled"]["mean_label"] <= 1 and metrics["examples"] == 4 * 39
    target = tmp_path / "target"
    shutil.copytree(ZOO_DIR / "pycode" / "target", target)
    train_vocabulary.main(["--target", str(target), "--samples", "6", "--new-tokens", "8", "--sample-batch", "3",
                           "--work-dir", str(tmp_path / "work")])
    config = json.loads((target / "config.json").read_text())
    assert sorted(config["token_ranking"]) == list(range(4096))
    assert config["token_ranking_tokenizer"] == train_vocabulary.tokenizer_digest(target)
    written = torch.load(tmp_path / "work" / "samples.pt")[:, train_vocabulary.PROMPT_TOKENS :]
    assert config["token_ranking"][0] == int(torch.bincount(written.flatten()).argmax())


def test_bad_arguments_fail_before_any_model_loads(capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_acceptance.main(["--held-out", "10", "--samples", "10"])
    assert exit_info.value.code == 2
    assert "--held-out (10) must be below --samples (10)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        train_vocabulary.main(["--samples", "0"])
    assert exit_info.value.code == 2
    assert "--samples must be >= 1, got 0" in capsys.readouterr().err
