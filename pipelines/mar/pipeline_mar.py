"""Class-to-image generation with a MAR model: class labels -> continuous tokens (masked random-order AR, per-token
diffusion head, CFG) -> KL autoencoder -> pixels. `decoding=AR()` runs the target alone on MAR's cosine schedule;
`decoding=ContinuousSpeculation(gamma=...)` lets the draft MAR draft `gamma` steps per target pass (see
`mmspec.continuous.mar_decoding` for what each acceptance rule samples).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import PIL.Image
import torch
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.image_processor import VaeImageProcessor
from diffusers.utils import BaseOutput

from mmspec.continuous import methods  # noqa: F401  registers the continuous decodings
from mmspec.continuous.diffusion import DiffusionSchedule
from mmspec.continuous.graphs import SamplerGraphs
from mmspec.continuous.mar_decoding import check_cfg_schedule
from mmspec.continuous.stats import ContinuousStats
from mmspec.core.component import DecodingComponent
from mmspec.core.rng import Generators, check_generators, sample_seeds
from mmspec.models.mar import KLAutoencoder, MARModel
from mmspec.pipelines.base import MMSpecPipeline
from mmspec.zoo import resolve_model

OUTPUT_TYPES = ("pil", "np", "pt", "latent")


@dataclass
class MARPipelineOutput(BaseOutput):
    """images: PIL images, NHWC array / NCHW tensor in [0, 1], or for `output_type="latent"` the tokens [B, L, C];
    stats: the call's ContinuousStats (target / draft encoder-decoder passes, acceptance, residual tries, log-ratio
    terms)."""

    images: list[PIL.Image.Image] | np.ndarray | torch.Tensor
    stats: ContinuousStats


class MARPipeline(MMSpecPipeline):
    r"""Class-conditioned MAR generation, optionally accelerated by a draft MAR.

    Components:
        transformer ([`MARModel`]): the target MAR (encoder / decoder and diffusion head).
        vae ([`KLAutoencoder`]): turns tokens (latents x its scaling factor, raster order) into pixels.
        draft_transformer ([`MARModel`], *optional*): a smaller MAR over the same tokens, the drafter of
            `ContinuousSpeculation`.
        decoding (`AR()` or `ContinuousSpeculation(...)`, a name or a config dict; defaults to `AR()`): what calls
            decode with unless they say otherwise; saved with the pipeline, swappable (`pipe.decoding = ...`).
    """

    model_cpu_offload_seq = "transformer->vae"
    _optional_components = ["draft_transformer"]
    modality = "continuous"
    steps_instead = "num_iter sets its AR steps and num_diffusion_steps the diffusion head's steps per token"
    _callback_tensor_inputs = ["latents", "known"]

    def __init__(self, transformer: MARModel, vae: KLAutoencoder, draft_transformer: MARModel | None = None,
                 decoding: DecodingComponent | str | dict = "ar"):
        super().__init__()
        self.register_modules(transformer=transformer, vae=vae, draft_transformer=draft_transformer)
        self.decoding = decoding
        self.sampler_graphs: SamplerGraphs | None = None  # `enable_cuda_graphs`
        self.image_processor = VaeImageProcessor(vae_scale_factor=vae.downsample_factor, do_normalize=True)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        """A zoo name, a folder written by `save_pretrained`, or a MAR release folder as LTH14/mar publishes one (no
        `model_index.json`: its `checkpoint-last.pth` and the KL-16 `kl16.ckpt`; see `from_mar_release`, which takes
        the keyword arguments then)."""
        path = Path(resolve_model(pretrained_model_name_or_path))
        if path.is_dir() and not (path / "model_index.json").is_file() and any(path.glob("*.pth")):
            return cls.from_mar_release(path, **kwargs)
        return super().from_pretrained(pretrained_model_name_or_path, **kwargs)

    @classmethod
    def from_mar_release(cls, folder: str | Path, vae: str | Path | None = None, model: str | None = None,
                         weights: str = "model_ema", vae_config: dict | None = None, dtype: torch.dtype | None = None,
                         **config) -> MARPipeline:
        """A MAR release folder: the model file (`checkpoint-last.pth`, the one `.pth` there) and the KL-16
        autoencoder (`kl16.ckpt` in the folder, or `vae=` its path).

        model: the size (`mar_base`, `mar_large`, `mar_huge`); None reads it from the file. weights: `"model_ema"`
        (what MAR's evaluation and demo load) or `"model"`. `config` overrides fields of the model's config (e.g.
        `x0_clip`), `vae_config` those of the autoencoder's (KL-16 by default). Missing files and weights raise a
        ValueError naming them.
        """
        folder = Path(folder)
        models = sorted(folder.glob("*.pth"))
        if len(models) != 1:
            raise ValueError(f"{folder} must hold one MAR model file (checkpoint-last.pth), found "
                             f"{[p.name for p in models] or 'none'}")
        if vae is None:
            vae = folder / "kl16.ckpt"
            if not vae.is_file():
                raise ValueError(f"{folder} has no KL-16 autoencoder (kl16.ckpt): put it in the folder or pass "
                                 "vae='path/to/kl16.ckpt'")
        transformer = MARModel.from_mar_checkpoint(models[0], model, weights=weights, **config).eval()
        autoencoder = KLAutoencoder.from_mar_checkpoint(vae, **{"embed_dim": transformer.config.token_dim,
                                                                **(vae_config or {})}).eval()
        pipe = cls(transformer, autoencoder)
        return pipe if dtype is None else pipe.to(dtype=dtype)

    def graph_stores(self, on: bool) -> None:
        """The diffusion heads' reverse chains (`mmspec.continuous.graphs`): all `num_diffusion_steps` sampler steps
        of a step's tokens in one graph, for the target and the draft alike (a token's chain is thousands of small
        kernels, bound by their launches on a GPU), captured on the second call of a shape."""
        self.sampler_graphs = SamplerGraphs(cuda=True) if on else None

    def check_inputs(self, class_labels, generator, output_type, num_iter, num_diffusion_steps, cfg_schedule="linear",
                     temperature=1.0):
        if isinstance(class_labels, int):
            class_labels = [class_labels]
        if not isinstance(class_labels, list) or not class_labels or not all(
                isinstance(c, int) and not isinstance(c, bool) for c in class_labels):
            raise TypeError(f"class_labels must be an int or a non-empty list of ints, got {class_labels!r}")
        classes = self.transformer.config.num_classes
        if not all(0 <= c < classes for c in class_labels):
            raise ValueError(f"class_labels must be in [0, {classes}), got {class_labels}")
        number = isinstance(temperature, (int, float)) and not isinstance(temperature, bool)
        if not number or not 0 <= temperature < math.inf:
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
        check_cfg_schedule(cfg_schedule)
        check_generators(generator, len(class_labels))
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type must be one of {OUTPUT_TYPES}, got {output_type!r}")
        seq_len = self.transformer.config.seq_len
        if isinstance(num_iter, bool) or not isinstance(num_iter, int) or not 1 <= num_iter <= seq_len:
            raise ValueError(f"num_iter must be an int in [1, {seq_len}], got {num_iter!r}")
        if isinstance(num_diffusion_steps, bool) or not isinstance(num_diffusion_steps, int) or not (
                1 <= num_diffusion_steps <= 1000):
            raise ValueError(f"num_diffusion_steps must be an int in [1, 1000], got {num_diffusion_steps!r}")
        return class_labels

    @torch.no_grad()
    def __call__(self, class_labels: int | list[int], num_iter: int = 64, num_diffusion_steps: int = 100,
                 guidance_scale: float = 3.0, cfg_schedule: str = "linear", temperature: float = 1.0,
                 generator: Generators = None,
                 output_type: str = "pil", return_dict: bool = True,
                 decoding: DecodingComponent | str | dict | None = None, plan: list[int] | None = None,
                 callback_on_step_end: Callable | PipelineCallback | MultiPipelineCallbacks | None = None,
                 callback_on_step_end_tensor_inputs: list[str] | None = None, **decoding_settings):
        r"""Generate one image per class label.

        Args:
            class_labels (`int` or `list[int]`): classes in [0, num_classes).
            num_iter (`int`, defaults to 64): AR steps (MAR's cosine schedule; `seq_len` = one token per step).
            plan (`list[int]`, *optional*): `decoding=AR()` only: tokens predicted per step, overriding the cosine
                schedule; e.g. `mmspec.continuous.mar_decoding.coarsen(cosine_plan(L, n), n_pre, gamma)` is the
                schedule whose law `acceptance="exact"` samples.
            num_diffusion_steps (`int`, defaults to 100): reverse diffusion steps of the head per token.
            guidance_scale (`float`, defaults to 3.0): CFG on the head's eps; 1 = off.
            cfg_schedule (`str`, defaults to `"linear"`): LTH14/mar's `cfg_schedule`: `"linear"` guides step s by
                1 + (guidance_scale - 1) (L - m) / L, m the tokens still unknown after it (at least 1, so the last
                step too is below guidance_scale); `"constant"` guides every step by guidance_scale.
            temperature (`float`, defaults to 1.0): scales the std of every reverse step.
            generator (`torch.Generator` or list): one per image makes each image depend on its own seed only.
            output_type (`str`): `"pil"`, `"np"`, `"pt"` or `"latent"` (tokens [B, L, C]).
            decoding (component, name or config dict, *optional*): defaults to the pipeline's `decoding` (`AR()`
                unless set or saved otherwise). `AR()` runs the target only; `ContinuousSpeculation(gamma,
                prefill_ratio, acceptance, max_tries, proposals_per_round)` drafts `gamma` steps per target pass with
                the draft MAR, the first `prefill_ratio` of the steps by the target; `acceptance=Exact()` samples the
                target on the coarsened schedule, `Paper()` is the released CSpD rule, not distribution-preserving; a
                rejected token's residual draws target proposals in batched rounds of `proposals_per_round`, after
                `max_tries` it keeps the last one (counted in `stats.fallbacks`). A name plus the settings as keyword
                arguments is the same call (`decoding="speculative", gamma=4`).
            **decoding_settings: the named decoding's settings (`ContinuousSpeculation`'s: gamma, prefill_ratio,
                acceptance, max_tries, proposals_per_round), or without a name the pipeline's own component's.
            callback_on_step_end (`Callable`, *optional*): called after every target pass (an AR step, a
                speculative prefill step or verification) as `callback_on_step_end(pipe, step, n_known,
                callback_kwargs)`; `callback_kwargs` holds the tensors named in `callback_on_step_end_tensor_inputs`
                (`"latents"`: the tokens [B, L, C] so far, zeros where unknown; `"known"`: [B, L] bool). Read-only.
                Set `pipe._interrupt = True` to stop there: unknown tokens stay zero (the latent mean).
            callback_on_step_end_tensor_inputs (`list[str]`, *optional*): see above; defaults to `["latents"]`.
        """
        decoding = self.decoding_for_call(decoding, decoding_settings)
        decoding.check_sampling(temperature)
        labels = self.check_inputs(class_labels, generator, output_type, num_iter, num_diffusion_steps, cfg_schedule,
                                   temperature)
        names = self.callback_tensor_inputs(callback_on_step_end, callback_on_step_end_tensor_inputs)
        device = self._execution_device
        seeds = sample_seeds(generator, len(labels)).to(device)
        label_tensor = torch.tensor(labels, device=device)
        schedule = DiffusionSchedule.cosine(num_diffusion_steps, x0_clip=self.transformer.config.x0_clip)
        self.replays_graphs()
        steps = decoding.run(self.transformer, self.draft_transformer, seeds, num_iter, schedule, label_tensor,
                             guidance_scale, temperature, plan, self.sampler_graphs, cfg_schedule)
        result = self.run_decoding(steps, callback_on_step_end, names, total=self.transformer.config.seq_len)
        tokens, stats = result.latents, result.stats
        stats.describe(decoding)
        images = tokens if output_type == "latent" else self.decode_tokens(tokens, output_type)
        self.maybe_free_model_hooks()
        if not return_dict:
            return images, stats
        return MARPipelineOutput(images=images, stats=stats)

    @torch.no_grad()
    def decode_tokens(self, tokens: torch.Tensor, output_type: str = "pil"):
        """Images of tokens [B, L, C] (raster order, scaled latents) as PIL / NHWC array / NCHW tensor in [0, 1]."""
        B, L, C = tokens.shape
        side = int(L**0.5)
        latents = tokens.transpose(1, 2).reshape(B, C, side, side) / self.vae.config.scaling_factor
        return self.image_processor.postprocess(self.vae.decode(latents.to(self.vae.dtype)).float(),
                                                output_type=output_type)
