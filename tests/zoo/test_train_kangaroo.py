"""Kangaroo's adapter trainer: it runs end to end on the embedded target (a few samples and steps; at one exit, and
sorted at several), reports the adapter's held-out acceptance at each exit beside the plain early exit's, saves an
adapter the pipeline loads, and refuses bad arguments before any model loads."""

import json

import pytest
import torch

from mmspec.adapters.nested_exits import NestedExits
from mmspec.adapters.views import kangaroo_view
from mmspec.models.kangaroo import KangarooAdapter
from mmspec.zoo import train_kangaroo
from tests.conftest import tiny_llama


@pytest.mark.parametrize("exit_layers", [None, [1, 2]])
def test_the_loss_is_the_exits_soft_cross_entropy_to_the_targets_law(exit_layers):
    """At one exit, and averaged over the exits of a sorted adapter."""
    target = tiny_llama(vocab_size=16, num_layers=3, dtype=torch.float32)
    adapter = KangarooAdapter.for_target(target, 1, exit_layers)
    tokens = torch.randint(0, 16, (2, 7), generator=torch.Generator().manual_seed(0))
    loss, cross_entropy = train_kangaroo.exit_losses(NestedExits(target, adapter), target, tokens, tv_weight=0.0)
    p = target(input_ids=tokens).logits.softmax(-1)
    expected = torch.stack([-(p * kangaroo_view(target, adapter, layer)(input_ids=tokens).logits.log_softmax(-1))
                           .sum(-1).mean() for layer in adapter.exits]).mean()
    torch.testing.assert_close(cross_entropy, expected)
    torch.testing.assert_close(loss, cross_entropy)


@pytest.mark.parametrize("exits", [[], ["--exit-layers", "2", "3", "5"]])
def test_the_command_runs_and_saves(tmp_path, exits):
    train_kangaroo.main(["--samples", "6", "--held-out", "2", "--new-tokens", "8", "--sample-batch", "3", "--steps",
                         "3", "--batch-size", "2", "--out-dir", str(tmp_path / "out"), "--work-dir",
                         str(tmp_path / "work"), "--exit-layer", "3", *exits])
    folder = tmp_path / "out" / "kangaroo_adapter"
    metrics = json.loads((folder / "training_metrics.json").read_text())
    adapter = KangarooAdapter.from_pretrained(folder)
    assert adapter.config.exit_layer == metrics["exit_layer"] == 3
    assert list(adapter.exits) == metrics["exit_layers"] == ([2, 3, 5] if exits else [3])
    for figures in (*metrics["adapter"].values(), metrics["plain_exit"]):
        assert 0 < figures["alpha"] < 1 and 0 < figures["top1_agreement"] < 1


@pytest.mark.parametrize(("argv", "message"), [(["--held-out", "10", "--samples", "10"], "must be below --samples"),
                                               (["--steps", "0"], "--steps must be >= 1"),
                                               (["--exit-layers", "2", "4"], "give --exit-layer, one of them")])
def test_bad_arguments_fail_before_any_model_loads(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_kangaroo.main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
