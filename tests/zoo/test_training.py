"""The zoo's shared training loop: a checkpoint resumes only a run it can continue; a time budget sets a step count
from throwaway steps (and a resumed run keeps its own); every trainer refuses a device this machine lacks before any
data is made."""

import importlib
import json

import pytest
import torch

from mmspec.zoo import ZOO_DIR, training
from mmspec.zoo.training import PROBE_STEPS, budgeted_steps, train_loop


def test_a_checkpoint_past_the_steps_asked_for_is_refused(tmp_path):
    model = torch.nn.Linear(2, 1)

    def loss(m, batch):
        value = m(batch).square().mean()
        return value, value

    def run(steps):
        return train_loop("tiny", model, steps=steps, lr=1e-2, loss_fn=loss,
                          batch_fn=lambda g: torch.randn(4, 2, generator=g), work_dir=tmp_path, seed=0)

    run(3)
    trained = model.weight.detach().clone()
    run(3)  # the finished run: nothing left to train
    assert torch.equal(model.weight, trained)
    with pytest.raises(ValueError, match="step 3, past the 2 steps asked for"):
        run(2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("trainer", ["train_image", "train_mar", "train_video"])
def test_a_device_this_machine_lacks_is_refused_before_any_data(trainer, tmp_path, capsys):
    main = importlib.import_module(f"mmspec.zoo.{trainer}").main
    with pytest.raises(SystemExit) as exit_info:
        main(["--device", "cuda", "--work-dir", str(tmp_path / "work"), "--out-dir", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        f"--device cuda: no CUDA device here (torch {torch.__version__}, CUDA not built in)")
    assert not (tmp_path / "work").exists() and not (tmp_path / "out").exists()


def test_a_time_budget_sets_the_step_count_from_throwaway_steps(tmp_path, monkeypatch):
    model = torch.nn.Linear(2, 1)
    before = [p.detach().clone() for p in model.parameters()]
    generator_states = []

    def batch_fn(generator):
        generator_states.append(generator.initial_seed())
        return torch.randn(4, 2, generator=generator)

    def loss(m, batch):
        value = m(batch).square().mean()
        return value, value

    clock = iter([10.0, 10.0 + PROBE_STEPS * 0.01])  # 10 ms a timed step
    monkeypatch.setattr(training.time, "perf_counter", lambda: next(clock))
    assert budgeted_steps("run", 1.0, 50, model, loss, batch_fn, tmp_path) == int(0.95 * 60 / 0.01)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # the run is untouched
    assert set(generator_states) == {0}  # batches from the probe's own generator
    assert budgeted_steps("run", None, 50, model, loss, batch_fn, tmp_path) == 50  # no budget: the steps asked for
    torch.save({"step": 7, "steps": 123}, tmp_path / "ckpt-run.pt")
    assert budgeted_steps("run", 1.0, 50, model, loss, batch_fn, tmp_path) == 123  # a resumed run keeps its count


@pytest.mark.slow  # a budgeted run end to end
def test_the_mar_trainer_takes_a_time_budget_and_refuses_a_bad_one(tmp_path, capsys):
    from mmspec.zoo.train_mar import main

    work = tmp_path / "work"
    common = ["--work-dir", str(work), "--train-scenes", "8", "--held-out-scenes", "4", "--vae-from",
              str(ZOO_DIR / "mar_shapes"), "--target-batch-size", "2"]
    with pytest.raises(SystemExit) as exit_info:
        main([*common, "--only", "target", "--target-minutes", "0"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().endswith("--target-minutes must be > 0, got 0.0")
    assert not work.exists()
    main([*common, "--only", "tokens"])
    main([*common, "--only", "target", "--target-minutes", "0.005"])
    steps = json.loads((work / "mar_target" / "training_metrics.json").read_text())["steps"]
    assert steps >= 1 and torch.load(work / "ckpt-mar-target.pt", weights_only=False)["steps"] == steps
