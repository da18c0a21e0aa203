"""The zoo's shared training loop: a checkpoint resumes only a run it can continue; every trainer refuses a device this
machine lacks before any data is made."""

import importlib

import pytest
import torch

from mmspec.zoo.training import train_loop


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
