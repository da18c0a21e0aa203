"""FID's Inception-v3 in plain torch: the weights-file layout, TF1 resize, the local-weights code path and its errors.

Bit-equality with torch-fidelity 0.4.0's `FeatureExtractorInceptionV3` (same random weights, inputs of 32x48 to
512x384) is checked by `python -m mmspec.eval.check_inception` against torch-fidelity's source, not here: torch-fidelity
needs torchvision, which has no CPU build.
"""

import pytest
import torch

from mmspec.eval.inception import FIDInceptionV3, resize_bilinear_tf1
from mmspec.eval.metrics import frechet_distance, image_features, load_inception

# torch-fidelity / pytorch-fid's weights file without its classifier: 94 conv + 94 batch-norm layers
STATE_DICT_ENTRIES = 94 + 94 * 5
PARAMETERS = 21_785_568


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory):
    """A random-weight file in the layout of weights-inception-2015-12-05-6726825d.pth (classifier included)."""
    torch.manual_seed(0)
    model = FIDInceptionV3()
    state = dict(model.state_dict(), **{"fc.weight": torch.randn(1008, 2048), "fc.bias": torch.zeros(1008)})
    path = tmp_path_factory.mktemp("inception") / "weights-inception-2015-12-05-6726825d.pth"
    torch.save(state, path)
    return path


def test_layout_matches_the_weights_file_names():
    state = FIDInceptionV3().state_dict()
    assert len(state) == STATE_DICT_ENTRIES
    assert sum(p.numel() for p in FIDInceptionV3().parameters()) == PARAMETERS
    for key in ("Conv2d_1a_3x3.conv.weight", "Mixed_5b.branch_pool.bn.running_var",
                "Mixed_6e.branch7x7dbl_5.conv.weight", "Mixed_7c.branch3x3dbl_3b.bn.num_batches_tracked"):
        assert key in state
    assert state["Mixed_6b.branch7x7_2.conv.weight"].shape == (128, 128, 1, 7)
    assert state["Mixed_7c.branch_pool.conv.weight"].shape == (192, 2048, 1, 1)


def test_tf1_resize_samples_without_half_pixel_offset():
    x = torch.tensor([[[[0.0, 10.0], [20.0, 30.0]]]])
    out = resize_bilinear_tf1(x, 4)  # TF1 samples at 0, 0.5, 1, 1.5 (clamped): no half-pixel shift
    expected_row = torch.tensor([0.0, 5.0, 10.0, 10.0])
    assert torch.equal(out[0, 0, 0], expected_row)
    assert torch.equal(out[0, 0, :, 0], torch.tensor([0.0, 10.0, 20.0, 20.0]))
    same = torch.rand(2, 3, 7, 7)
    assert torch.equal(resize_bilinear_tf1(same, 7), same)


def test_local_weights_code_path(weights_file):
    model = load_inception(weights_file)
    reference = FIDInceptionV3()
    reference.load_state_dict({k: v for k, v in torch.load(weights_file).items() if not k.startswith("fc.")})
    images = torch.randint(0, 256, (3, 3, 64, 64), dtype=torch.uint8)
    features = image_features(model, images)
    assert features.shape == (3, 2048) and torch.isfinite(features).all()
    assert torch.equal(features.float(), reference.eval()(images))
    assert frechet_distance(features, features) == pytest.approx(0.0, abs=1e-6)


def test_clear_errors(tmp_path, weights_file):
    with pytest.raises(ValueError, match="inception_weights: no file"):
        load_inception(tmp_path / "missing.pth")
    wrong = tmp_path / "wrong.pth"
    torch.save({"conv.weight": torch.zeros(1)}, wrong)
    with pytest.raises(ValueError, match="is not the FID Inception-v3 state dict"):
        load_inception(wrong)
    with pytest.raises(TypeError, match="uint8"):
        FIDInceptionV3()(torch.rand(1, 3, 8, 8))
