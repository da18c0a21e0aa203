"""Check `mmspec.eval.inception.FIDInceptionV3` against torch-fidelity's `FeatureExtractorInceptionV3`, feature for
feature, on the same random weights (the real weights cannot be downloaded everywhere; a random file in their layout
tests the same code). torch-fidelity itself imports torchvision, so its feature-extractor module is loaded from its
source with the package's other imports stubbed:

    pip download torch-fidelity==0.4.0 --no-deps -d /tmp/tf && cd /tmp/tf && unzip -o -q torch_fidelity-*.whl
    python -m mmspec.eval.check_inception --torch-fidelity-src /tmp/tf/torch_fidelity

Prints the largest absolute difference of the TF1 resize and of the 2048-d features for several input sizes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import types
from pathlib import Path

import torch
from torch import nn

from mmspec.eval.inception import INPUT_SIZE, FIDInceptionV3, resize_bilinear_tf1


def load_torch_fidelity(src: Path):
    """(FeatureExtractorInceptionV3, interpolate_bilinear_2d_like_tensorflow1x) from torch-fidelity's source folder."""
    package = types.ModuleType("torch_fidelity")
    package.__path__ = [str(src)]
    base = types.ModuleType("torch_fidelity.feature_extractor_base")

    class FeatureExtractorBase(nn.Module):
        def __init__(self, name, features_list):
            super().__init__()
            self.name, self.features_list = name, features_list

    def vassert(condition, message):
        if not condition:
            raise ValueError(message)

    base.FeatureExtractorBase = FeatureExtractorBase
    helpers = types.ModuleType("torch_fidelity.helpers")
    helpers.vassert = vassert
    helpers.text_to_dtype = lambda name, default: getattr(torch, name or default)
    helpers.get_kwarg = lambda name, kwargs: kwargs.get(name)
    sys.modules.update({"torch_fidelity": package, base.__name__: base, helpers.__name__: helpers})
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3
    from torch_fidelity.interpolate_compat_tensorflow import interpolate_bilinear_2d_like_tensorflow1x

    return FeatureExtractorInceptionV3, interpolate_bilinear_2d_like_tensorflow1x


@torch.no_grad()
def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--torch-fidelity-src", required=True, help="the unpacked torch_fidelity package folder")
    args = parser.parse_args(argv)
    theirs_class, theirs_resize = load_torch_fidelity(Path(args.torch_fidelity_src))

    torch.manual_seed(0)
    model = FIDInceptionV3()
    for module in model.modules():  # non-trivial batch-norm statistics, so that every layer matters
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.normal_(0, 0.1), module.running_var.uniform_(0.5, 2)
            module.weight.data.uniform_(0.5, 1.5), module.bias.data.normal_(0, 0.1)
    state = dict(model.state_dict(), **{"fc.weight": torch.randn(1008, 2048), "fc.bias": torch.randn(1008)})
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "weights-inception-2015-12-05-6726825d.pth"
        torch.save(state, path)
        ours = FIDInceptionV3.from_weights(path)
        theirs = theirs_class("inception-v3-compat", ["2048"], feature_extractor_weights_path=str(path)).eval()
    worst = 0.0
    for size in ((64, 64), (32, 48), (299, 299), (512, 384)):
        images = torch.randint(0, 256, (3, 3, *size), dtype=torch.uint8)
        resize = (resize_bilinear_tf1(images.float(), INPUT_SIZE) - theirs_resize(
            images.float(), size=(INPUT_SIZE, INPUT_SIZE), align_corners=False)).abs().max().item()
        features = (ours(images) - theirs(images)[0]).abs().max().item()
        worst = max(worst, resize, features)
        print(f"input {size[0]}x{size[1]}: resize max |diff| {resize}, features max |diff| {features}")
    return worst


if __name__ == "__main__":
    main()
