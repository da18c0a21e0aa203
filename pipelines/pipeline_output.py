from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import PIL.Image
import torch
from diffusers.utils import BaseOutput

from mmspec.core.stats import SpecStats


@dataclass
class ARImagePipelineOutput(BaseOutput):
    """Output of the AR image pipelines.

    images: PIL images, an NHWC float array / NCHW float tensor in [0, 1], or for `output_type="latent"` the image
        token ids [B, h*w] (long, raster order).
    stats: the decoding's counters (target forwards, accepted lengths, timings).
    """

    images: list[PIL.Image.Image] | np.ndarray | torch.Tensor
    stats: SpecStats
