"""The Inception-v3 network of standard FID (the TensorFlow graph `inception-2015-12-05` behind every published FID
number), written in plain torch so that it runs without torchvision or torch-fidelity.

It loads the converted weights that torch-fidelity and torchmetrics use,
`weights-inception-2015-12-05-6726825d.pth` (download once from
https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/weights-inception-2015-12-05-6726825d.pth on a
machine with network access; pytorch-fid's `pt_inception-2015-12-05-6726825d.pth` is the same file), and reproduces
that graph's preprocessing: uint8 RGB in, TensorFlow-1 bilinear resize to 299x299 (no antialiasing, no half-pixel
offset), (x - 128) / 128, then the 2048-d average-pooled features that FID and KID compare. The TensorFlow graph's
quirks are kept: average pools ignore padding, and the last block pools with max instead of average.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

INPUT_SIZE = 299
WEIGHTS_URL = "https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/weights-inception-2015-12-05-6726825d.pth"

# A conv layer: (name, out_channels, kernel, padding, stride). A branch: (pool before its convs or None, its chain of
# convs, convs applied side by side to the chain's output and concatenated). A block concatenates its branches.
POOLS = {
    "avg": lambda x: F.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False),
    "max": lambda x: F.max_pool2d(x, 3, stride=1, padding=1),
    "max/2": lambda x: F.max_pool2d(x, 3, stride=2),
}


def block_a(pool_features: int) -> list:
    return [
        (None, [("branch1x1", 64, 1, 0, 1)], []),
        (None, [("branch5x5_1", 48, 1, 0, 1), ("branch5x5_2", 64, 5, 2, 1)], []),
        (None, [("branch3x3dbl_1", 64, 1, 0, 1), ("branch3x3dbl_2", 96, 3, 1, 1), ("branch3x3dbl_3", 96, 3, 1, 1)], []),
        ("avg", [("branch_pool", pool_features, 1, 0, 1)], []),
    ]


def block_b() -> list:
    return [
        (None, [("branch3x3", 384, 3, 0, 2)], []),
        (None, [("branch3x3dbl_1", 64, 1, 0, 1), ("branch3x3dbl_2", 96, 3, 1, 1), ("branch3x3dbl_3", 96, 3, 0, 2)], []),
        ("max/2", [], []),
    ]


def block_c(c7: int) -> list:
    row, col = ((1, 7), (0, 3)), ((7, 1), (3, 0))
    return [
        (None, [("branch1x1", 192, 1, 0, 1)], []),
        (None, [("branch7x7_1", c7, 1, 0, 1), ("branch7x7_2", c7, *row, 1), ("branch7x7_3", 192, *col, 1)], []),
        (None, [("branch7x7dbl_1", c7, 1, 0, 1), ("branch7x7dbl_2", c7, *col, 1), ("branch7x7dbl_3", c7, *row, 1),
                ("branch7x7dbl_4", c7, *col, 1), ("branch7x7dbl_5", 192, *row, 1)], []),
        ("avg", [("branch_pool", 192, 1, 0, 1)], []),
    ]


def block_d() -> list:
    return [
        (None, [("branch3x3_1", 192, 1, 0, 1), ("branch3x3_2", 320, 3, 0, 2)], []),
        (None, [("branch7x7x3_1", 192, 1, 0, 1), ("branch7x7x3_2", 192, (1, 7), (0, 3), 1),
                ("branch7x7x3_3", 192, (7, 1), (3, 0), 1), ("branch7x7x3_4", 192, 3, 0, 2)], []),
        ("max/2", [], []),
    ]


def block_e(pool: str) -> list:
    def pair(prefix: str) -> list:
        return [(f"{prefix}a", 384, (1, 3), (0, 1), 1), (f"{prefix}b", 384, (3, 1), (1, 0), 1)]

    return [
        (None, [("branch1x1", 320, 1, 0, 1)], []),
        (None, [("branch3x3_1", 384, 1, 0, 1)], pair("branch3x3_2")),
        (None, [("branch3x3dbl_1", 448, 1, 0, 1), ("branch3x3dbl_2", 384, 3, 1, 1)], pair("branch3x3dbl_3")),
        (pool, [("branch_pool", 192, 1, 0, 1)], []),
    ]


class ConvBN(nn.Module):
    """Conv (no bias) -> BatchNorm (eps 1e-3, inference statistics) -> ReLU."""

    def __init__(self, in_channels: int, out_channels: int, kernel, padding=0, stride=1):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(out_channels, eps=1e-3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class InceptionBlock(nn.Module):
    """Parallel branches over one input, concatenated on channels. Layers are attributes named as in the weights file
    (`Mixed_6b.branch7x7_2.conv.weight`)."""

    def __init__(self, in_channels: int, branches: list):
        super().__init__()
        self.branches, self.out_channels = [], 0
        for pool, chain, side_by_side in branches:
            channels = in_channels
            for name, out, kernel, padding, stride in chain:
                self.add_module(name, ConvBN(channels, out, kernel, padding, stride))
                channels = out
            for name, out, kernel, padding, stride in side_by_side:
                self.add_module(name, ConvBN(channels, out, kernel, padding, stride))
            self.out_channels += sum(spec[1] for spec in side_by_side) if side_by_side else channels
            self.branches.append((pool, [c[0] for c in chain], [c[0] for c in side_by_side]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outputs = []
        for pool, chain, side_by_side in self.branches:
            h = POOLS[pool](x) if pool else x
            for name in chain:
                h = self.get_submodule(name)(h)
            if side_by_side:
                h = torch.cat([self.get_submodule(name)(h) for name in side_by_side], dim=1)
            outputs.append(h)
        return torch.cat(outputs, dim=1)


def resize_bilinear_tf1(x: torch.Tensor, size: int) -> torch.Tensor:
    """TensorFlow 1.x `resize_bilinear` (align_corners=False): output pixel i samples the input at i * in / out (no
    half-pixel offset), clamped at the last row / column. x: float [N, C, H, W] -> [N, C, size, size]."""

    def taps(n_in: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        position = torch.arange(size, dtype=x.dtype, device=x.device) * torch.tensor(n_in / size, dtype=torch.float32)
        low = position.long()
        return low, (low + 1).clamp_max(n_in - 1), position - low.to(x.dtype)

    x_low, x_high, x_frac = taps(x.shape[-1])
    y_low, y_high, y_frac = taps(x.shape[-2])
    left, right = x[..., x_low], x[..., x_high]
    rows = left + (right - left) * x_frac
    top, bottom = rows[..., y_low, :], rows[..., y_high, :]
    return top + (bottom - top) * y_frac.view(-1, 1)


class FIDInceptionV3(nn.Module):
    """uint8 images [N, 3, H, W] -> the 2048-d pool features of FID's Inception-v3 (float32 [N, 2048]).

    Use it as torchmetrics' `feature=` module; build it from the weights file with `from_weights(path)`.
    """

    num_features = 2048

    def __init__(self):
        super().__init__()
        layers = {
            "Conv2d_1a_3x3": ConvBN(3, 32, 3, stride=2), "Conv2d_2a_3x3": ConvBN(32, 32, 3),
            "Conv2d_2b_3x3": ConvBN(32, 64, 3, padding=1), "MaxPool_1": nn.MaxPool2d(3, stride=2),
            "Conv2d_3b_1x1": ConvBN(64, 80, 1), "Conv2d_4a_3x3": ConvBN(80, 192, 3),
            "MaxPool_2": nn.MaxPool2d(3, stride=2),
        }
        blocks = [("Mixed_5b", block_a(32)), ("Mixed_5c", block_a(64)), ("Mixed_5d", block_a(64)),
                  ("Mixed_6a", block_b()), ("Mixed_6b", block_c(128)), ("Mixed_6c", block_c(160)),
                  ("Mixed_6d", block_c(160)), ("Mixed_6e", block_c(192)), ("Mixed_7a", block_d()),
                  ("Mixed_7b", block_e("avg")), ("Mixed_7c", block_e("max"))]
        channels = 192
        for name, branches in blocks:
            layers[name] = InceptionBlock(channels, branches)
            channels = layers[name].out_channels
        for name, layer in layers.items():  # top-level names, as in the weights file; forward runs them in order
            self.add_module(name, layer)

    @classmethod
    def from_weights(cls, path: str | Path) -> FIDInceptionV3:
        """Load `weights-inception-2015-12-05-6726825d.pth` (its 1008-way classifier `fc.*` is not used by FID)."""
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"inception_weights: no file at {str(path)!r}; download {WEIGHTS_URL} on a machine with "
                             "network access and pass its local path")
        state_dict = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state_dict, dict):
            raise ValueError(f"inception_weights: {str(path)!r} does not hold a state dict")
        state_dict = {k: v for k, v in state_dict.items() if not k.startswith("fc.")}
        model = cls()
        missing, unexpected = model.load_state_dict(state_dict, strict=False)
        if missing or unexpected:
            raise ValueError(f"inception_weights: {str(path)!r} is not the FID Inception-v3 state dict "
                             f"(missing {missing[:3]}..., unexpected {unexpected[:3]}...)")
        return model.eval().requires_grad_(False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
            raise TypeError(f"images: expected uint8 [N, 3, H, W], got {images.dtype} {list(images.shape)}")
        x = resize_bilinear_tf1(images.float(), INPUT_SIZE)
        x = (x - 128) / 128
        for layer in self.children():
            x = layer(x)
        return x.mean(dim=(2, 3))
