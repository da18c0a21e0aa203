"""The zoo's shared training loop: a checkpoint resumes only a run it can continue."""

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
