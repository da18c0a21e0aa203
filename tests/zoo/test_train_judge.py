"""Judge decoding's trainer: the task metric it mines labels with, its threshold rule, and the command end to end on
the embedded pair (a few prompts and steps); bad arguments fail before any model loads."""

import json

import pytest
import torch

from mmspec.models.judge import JudgeHead
from mmspec.zoo import train_judge
from mmspec.zoo.text_corpus import syntax_valid


def test_syntax_valid_takes_cut_completions_and_rejects_errors():
    assert syntax_valid("def f(x):\n    return [x,\n")  # an open bracket at the cut: incomplete, not wrong
    assert syntax_valid("    def f(self):\n        return 1\n\nclass A:\n")  # a method: read inside a block
    assert syntax_valid("def f(x):\n    y = x +")  # the unfinished last line is not read
    assert not syntax_valid("def f(x):\n    return x)\n")
    assert not syntax_valid("def f(x):\nreturn x\n")


def test_the_threshold_keeps_the_most_at_the_precision():
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
    labels = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    threshold = train_judge.precise_threshold(scores, labels, precision=0.75, least=1)
    assert 0.5 > threshold > 0.4  # the five best: 4 of 5 good
    assert train_judge.precise_threshold(scores, labels, precision=0.99, least=4) == 0.99  # none reaches it
    assert train_judge.auc(scores, labels) == pytest.approx(7 / 8)


def test_the_command_runs_and_saves(tmp_path):
    train_judge.main(["--prompts", "4", "--new-tokens", "24", "--line-tokens", "8", "--steps", "3",
                      "--out-dir", str(tmp_path)])
    metrics = json.loads((tmp_path / "judge_head" / "training_metrics.json").read_text())
    head = JudgeHead.from_pretrained(tmp_path / "judge_head")
    assert head.config.threshold == metrics["threshold"] and 0 < metrics["threshold"] < 1
    assert 0 < metrics["labelled"] <= metrics["mismatches"] and 0 <= metrics["good_share"] <= 1


@pytest.mark.parametrize(("argv", "message"), [(["--precision", "1"], "--precision must be in (0, 1)"),
                                               (["--prompts", "0"], "--prompts must be >= 1")])
def test_bad_arguments_fail_before_any_model_loads(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_judge.main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
