"""`ARImagePipeline`: what every discrete-token text-to-image pipeline shares — input checks, the decoding component
it holds and saves (`pipe.decoding`: "auto", `AR()`, `SJD(...)`, `DraftModel(...)`) and the one a call may name
instead, the decode loop with progress bar, step-end callbacks and interruption, decoding to pixels, and loading a
family's own checkpoint directory.

A family pipeline (LlamaGen, Janus, Emu3, Lumina-mGPT) supplies three hooks: `image_adapter(height, width)` (its
`mmspec.image.DiscreteImageModel` adapter for that image size, raising for sizes the model cannot make),
`encode_prompt(prompts, negative_prompt, adapter)` (the condition of one image per prompt) and, for transformers
checkpoints, `from_checkpoint_dir`. Every family is called the same way and returns the same output and stats.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback

from mmspec.core.component import DecodingComponent
from mmspec.core.probs import SamplingConfig
from mmspec.core.rng import Generators, check_generators
from mmspec.core.stats import SpecStats
from mmspec.image import methods  # noqa: F401  registers the image decodings
from mmspec.image.loop import PAD_ID
from mmspec.image.policy import DecodingPolicy
from mmspec.models.hf_image import CausalLMImageAdapter, SlotGraphs, on_slot_cache
from mmspec.pipelines.auto import pipeline_class_for, saved_class_name
from mmspec.pipelines.base import MMSpecPipeline
from mmspec.pipelines.pipeline_output import ARImagePipelineOutput
from mmspec.zoo import resolve_model

OUTPUT_TYPES = ("pil", "np", "pt", "latent")


class ARImagePipeline(MMSpecPipeline):
    """Base of the discrete-token text-to-image pipelines (see the module docstring)."""

    modality = "image"
    steps_instead = ("an AR image has a fixed number of tokens, and the decoding sets how many target forwards they "
                     "take (decoding=SJD(window=16), AR())")
    _callback_tensor_inputs = ["tokens", "n_committed"]
    default_guidance_scale: float = 3.0
    default_top_k: int = 0
    checkpoint_model_type: str | None = None  # config.json model_type of the family's own checkpoints
    checkpoint_model_class: type | None = None  # the transformers class that loads them
    checkpoint_files: str | None = None  # or: a glob naming the family's released weight files in a folder

    # --- family hooks -------------------------------------------------------------------------------------------
    def image_adapter(self, height: int | None = None, width: int | None = None):
        """The family's image adapter for an image of height x width pixels (None = native size)."""
        raise NotImplementedError

    def encode_prompt(self, prompts: list[str], negative_prompt: list[str] | None, adapter):
        """The condition of one image per prompt."""
        raise NotImplementedError

    def graphed(self, adapter):
        """On CUDA a transformers family's adapter decodes on a fixed-capacity slot cache with its decoding steps
        captured as CUDA graphs (`mmspec.models.hf_image.on_slot_cache`; the graphs are kept with the pipeline, so a
        later call replays them); elsewhere the adapter as it is (LlamaGen's captures its own `WindowGraphs`)."""
        if not isinstance(adapter, CausalLMImageAdapter) or adapter.model.device.type != "cuda":
            return adapter
        if "_slot_graphs" not in vars(self):
            self._slot_graphs = SlotGraphs()
        return on_slot_cache(adapter, self._slot_graphs)

    def draft_adapter(self):
        """The adapter of the pipeline's draft model for `decoding="draft"`, or None."""
        return None

    def resolve_decoding(self, value: DecodingComponent | str | dict, **settings) -> DecodingComponent | str:
        """`pipe.decoding` is `"auto"` (the default; see `decoding_policy`) or a component (`SJD(window=16)`,
        `AR()`, `DraftModel(...)`, ... : `mmspec.core.registry.decodings("image")`); settings include the rules'
        flat spellings (`lantern_k`)."""
        if isinstance(value, str) and value == "auto":
            if settings:
                raise ValueError(f'decoding="auto" chooses the decoding and its settings; name one to give '
                                 f"{sorted(settings)}")
            return value
        return super().resolve_decoding(value, **settings)

    @property
    def decoding_policy(self) -> DecodingPolicy:
        """What `decoding="auto"` asks: the window cost curves of this pipeline's model on its device (measured once,
        cached on disk) and the acceptance its runs reached. A choice holds for its batch size for the life of the
        pipeline until a run far off its prediction; calls with a generator keep the choice the first of them was
        given even then. `pipe.decoding_policy.reconsider()` chooses again with what the runs reached, `remeasure()`
        also measures the cost curves again."""
        if getattr(self, "_decoding_policy", None) is None:
            self._decoding_policy = DecodingPolicy(progress=self.status_bar)
        return self._decoding_policy

    # --- state during a call ------------------------------------------------------------------------------------
    @property
    def guidance_scale(self) -> float:
        return self._guidance_scale

    @property
    def do_classifier_free_guidance(self) -> bool:
        return self._guidance_scale != 1.0

    # --- loading ------------------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        """A zoo name, a directory saved by `save_pretrained` (`model_index.json`), or the family's own release: the
        checkpoint directory of a transformers model (`config.json`, e.g. a download of
        `deepseek-community/Janus-Pro-1B`) or a folder of released weight files (`checkpoint_files`), then
        `from_checkpoint_dir(path, **kwargs)`."""
        path = Path(resolve_model(pretrained_model_name_or_path))
        index = path / "model_index.json"
        if index.is_file():
            saved = saved_class_name(path)
            if saved != cls.__name__:
                raise ValueError(f"{path} holds a {saved} (model_index.json), not a {cls.__name__}; load it with "
                                 f"{saved}.from_pretrained or mmspec.AutoARImagePipeline")
        elif (path / "config.json").is_file():
            model_type = json.loads((path / "config.json").read_text()).get("model_type")
            if cls.checkpoint_model_type is None or model_type != cls.checkpoint_model_type:
                other = pipeline_class_for(path)
                raise ValueError(f"{path} is a {model_type!r} checkpoint, which {cls.__name__} does not load; use "
                                 f"{other.__name__}.from_pretrained")
            return cls.from_checkpoint_dir(path, **kwargs)
        elif cls.checkpoint_files is not None and any(path.glob(cls.checkpoint_files)):
            return cls.from_checkpoint_dir(path, **kwargs)
        return super().from_pretrained(pretrained_model_name_or_path, **kwargs)

    @classmethod
    def from_checkpoint_dir(cls, path: Path, dtype: torch.dtype | None = None, **kwargs):
        """A transformers family's checkpoint folder: its `checkpoint_model_class` model (missing weights refused)
        and its tokenizer. Families with more pieces override this."""
        from transformers import AutoTokenizer

        model = load_transformers_model(cls.checkpoint_model_class, path, dtype=dtype, **kwargs)
        return cls(model, AutoTokenizer.from_pretrained(path))

    # --- inputs -------------------------------------------------------------------------------------------------
    def check_inputs(self, prompt, num_images_per_prompt, negative_prompt, generator,
                     output_type) -> tuple[list[str], list[str] | None]:
        prompts = [prompt] if isinstance(prompt, str) else prompt
        if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
            raise TypeError(f"prompt must be a str or a list of str, got {type(prompt).__name__}")
        if not prompts:
            raise ValueError("prompt is an empty list; pass at least one prompt")
        empty = [i for i, p in enumerate(prompts) if not p.strip()]
        if empty:
            raise ValueError(f"prompt {empty[0]} is empty (or only whitespace); say what to draw")
        negatives = [negative_prompt] * len(prompts) if isinstance(negative_prompt, str) else negative_prompt
        if negatives is not None and (not isinstance(negatives, list) or len(negatives) != len(prompts)
                                      or not all(isinstance(p, str) for p in negatives)):
            raise ValueError(f"negative_prompt must be a str or a list of {len(prompts)} str (one per prompt)")
        if isinstance(num_images_per_prompt, bool) or not isinstance(num_images_per_prompt, int):
            raise TypeError(f"num_images_per_prompt must be an int, got {type(num_images_per_prompt).__name__}")
        if num_images_per_prompt < 1:
            raise ValueError(f"num_images_per_prompt must be >= 1, got {num_images_per_prompt}")
        check_generators(generator, len(prompts) * num_images_per_prompt)
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type must be one of {OUTPUT_TYPES}, got {output_type!r}")
        return prompts, negatives

    # --- outputs ------------------------------------------------------------------------------------------------
    def _decode_partial(self, adapter, tokens: torch.Tensor) -> torch.Tensor:
        """Pixels [B, 3, H, W] in [-1, 1] of image-span tokens [B, N] with PAD_ID where not generated (an interrupted
        run): generated cells are decoded, the rest shown mid-grey. Forced structure columns are filled in."""
        h, span_w = adapter.grid
        missing = tokens == PAD_ID
        forced = getattr(adapter, "forced_tokens", None)
        filled = tokens.masked_fill(missing, 0)
        if forced is not None:
            filled = torch.where(forced.to(tokens.device) >= 0, forced.to(tokens.device), filled)
        images = adapter.decode(filled)
        if missing.any():
            scale = images.shape[-2] // h
            cells = missing.view(-1, 1, h, span_w)[..., : images.shape[-1] // scale]
            images = images.masked_fill(cells.repeat_interleave(scale, 2).repeat_interleave(scale, 3), 0.0)
        return images

    @torch.no_grad()
    def decode_tokens(self, tokens: torch.Tensor, output_type: str = "pil", height: int | None = None,
                      width: int | None = None):
        """Images of image-span tokens [B, N] as `output_type="latent"` returns them (PAD_ID cells mid-grey), for an
        image of height x width pixels (None = native): PIL images (`"pil"`), an NHWC float array (`"np"`) or an
        NCHW float tensor (`"pt"`) in [0, 1]."""
        if output_type not in OUTPUT_TYPES or output_type == "latent":
            raise ValueError(f"output_type must be one of {[t for t in OUTPUT_TYPES if t != 'latent']}, got "
                             f"{output_type!r}")
        pixels = self._decode_partial(self.image_adapter(height, width), tokens).float()
        return self.image_processor.postprocess(pixels, output_type=output_type)

    # --- the call -----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def __call__(
        self,
        prompt: str | list[str],
        height: int | None = None,
        width: int | None = None,
        num_images_per_prompt: int = 1,
        guidance_scale: float | None = None,
        cfg_interval: int = -1,
        negative_prompt: str | list[str] | None = None,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float = 1.0,
        generator: Generators = None,
        output_type: str = "pil",
        return_dict: bool = True,
        callback_on_step_end: Callable | PipelineCallback | MultiPipelineCallbacks | None = None,
        callback_on_step_end_tensor_inputs: list[str] | None = None,
        decoding: DecodingComponent | str | dict | None = None,
        **decoding_settings,
    ) -> ARImagePipelineOutput | tuple:
        r"""Generate images from text.

        Args:
            prompt (`str` or `list[str]`): what to draw.
            height (`int`, *optional*), width (`int`, *optional*): the image size in pixels; defaults to the model's
                native size. A size the model cannot generate raises a `ValueError` that names the allowed ones.
            num_images_per_prompt (`int`, defaults to 1): images per prompt; the batch is prompts x this.
            guidance_scale (`float`, *optional*): classifier-free guidance scale s >= 0, combined on logits as
                `uncond + s * (cond - uncond)` before temperature / top-k / top-p; 1.0 turns guidance off (no
                unconditional rows are run). Defaults to the family's recommended value (`default_guidance_scale`).
            cfg_interval (`int`, defaults to -1): LlamaGen's `generate(cfg_interval=)`, with its count: image tokens
                0 .. cfg_interval + 1 are guided, the later ones sampled from the conditional logits alone; -1 guides
                every token.
            negative_prompt (`str` or `list[str]`, *optional*): the unconditional rows' text, for the families whose
                CFG takes one (Emu3); the others raise.
            temperature (`float`, defaults to 1.0): softmax temperature; 0 = greedy.
            top_k (`int`, *optional*): keep the k most likely image tokens; 0 = all. Defaults to the family's
                recommended value (`default_top_k`).
            top_p (`float`, defaults to 1.0): nucleus sampling mass; 1.0 = off.
            generator (`torch.Generator` or `list[torch.Generator]`, *optional*): one generator for the batch, or one
                per image (prompts x num_images_per_prompt), which makes each image depend on its own seed only —
                for a given decoding: `decoding="auto"` keeps its choice for a batch size on every call of this
                pipeline with a generator, but may choose another window at another batch size, on another machine
                or after `decoding_policy.reconsider()`, which samples the same law with other numbers. Name the
                decoding (`decoding=SJD(window=16)`, `window=16`, or the config `out.stats.decoding` of a call
                `"auto"` chose for) for images that reproduce bit for bit everywhere.
            output_type (`str`, defaults to `"pil"`): `"pil"`, `"np"` (NHWC in [0, 1]), `"pt"` (NCHW in [0, 1]) or
                `"latent"` (the image-span token ids [B, N], the adapter's local ids).
            return_dict (`bool`, defaults to `True`): return an [`ARImagePipelineOutput`] instead of a tuple
                `(images, stats)`.
            callback_on_step_end (`Callable`, *optional*): called after every target forward as
                `callback_on_step_end(pipe, step, n_generated, callback_kwargs)`; `callback_kwargs` holds the tensors
                named in `callback_on_step_end_tensor_inputs` (`"tokens"`: [B, N] with -1 where not generated yet,
                `"n_committed"`: [B]). They are read-only: committed tokens already sit in the KV cache. Set
                `pipe._interrupt = True` to stop early; unfinished cells are then shown grey (or -1 in latents).
            callback_on_step_end_tensor_inputs (`list[str]`, *optional*): see above; defaults to `["tokens"]`.
            decoding (component, name or config dict, *optional*): how tokens are generated; defaults to the
                pipeline's `decoding` (itself `"auto"` unless set or saved otherwise). Any registered image decoding
                (`mmspec.core.registry.decodings("image")`), e.g. `SJD(window=16, init="horizontal",
                coupling="maximal", acceptance=Exact())` (speculative Jacobi decoding, lossless: the same output law
                as `AR()` in fewer target forwards), `DraftModel(draft_length=4)` (pipelines with a
                `draft_transformer`) or `AR()` (one token per target forward) — or its name (`decoding="sjd"`).
                `stats.law` says whether a decoding kept the model's law. `"auto"` is the fastest exact decoding for
                this model, device and batch size: SJD at the window (or with the frontier tree) a measured cost
                curve favours, the pipeline's EAGLE head's chain where it pays more, or plain AR when none pays
                (`mmspec.image.policy`; `stats.chosen_by` says what it chose and why).
            **decoding_settings: the settings of the named decoding as keyword arguments (`decoding="sjd",
                window=8`), or, without a name, of the pipeline's own component; the acceptance rule
                (`acceptance=Lantern(k=100, delta=0.1)`, or a registered rule's name with its settings spelled flat:
                `acceptance="lantern", lantern_k=100`; `mmspec.core.registry.rules("image")`). Each component's class
                documents its settings; a setting it does not take is refused.
        """
        # 1. Check inputs
        prompts, negatives = self.check_inputs(prompt, num_images_per_prompt, negative_prompt, generator,
                                               output_type)
        tensor_inputs = self.callback_tensor_inputs(callback_on_step_end, callback_on_step_end_tensor_inputs)
        guidance_scale = self.default_guidance_scale if guidance_scale is None else guidance_scale
        top_k = self.default_top_k if top_k is None else top_k
        sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, guidance_scale=guidance_scale,
                                  cfg_interval=cfg_interval)
        decoding = self.decoding_for_call(decoding, decoding_settings)
        if not isinstance(decoding, str):
            decoding.check_sampling(temperature)
        adapter = self.graphed(self.image_adapter(height, width))
        self._guidance_scale = guidance_scale

        # 2. Encode the prompts, one condition row per image
        repeat = num_images_per_prompt
        condition = self.encode_prompt([p for p in prompts for _ in range(repeat)],
                                       None if negatives is None else [p for p in negatives for _ in range(repeat)],
                                       adapter)
        batch_size = len(prompts) * repeat
        choice = None
        if isinstance(decoding, str):  # "auto": the policy chooses now that the condition is encoded
            choice = self.decoding_policy.choose(adapter, condition, batch_size, sampling,
                                                 getattr(self, "eagle_head", None), seeded=generator is not None)
            decoding = choice.decoding
        decoder = self.supplied(decoding)

        # 3. Decode image tokens
        stats, tokens = SpecStats(chosen_by=choice and choice.reason,
                                  predicted_speedup=choice and choice.predicted_speedup), None
        stats.describe(decoder)
        N = adapter.grid[0] * adapter.grid[1]
        steps = decoder.run(adapter, condition, sampling, generator, stats,
                            block=None if callback_on_step_end is None else 1)
        tokens = self.run_decoding(steps, callback_on_step_end, tensor_inputs, total=N).tokens

        if choice is not None and not self._interrupt:
            gap = self.decoding_policy.record(choice, batch_size, sampling, stats)
            if gap is not None:
                stats.chosen_by += f"; {gap}"

        # 4. Post-process
        if output_type == "latent":
            images = tokens
        else:
            images = self.image_processor.postprocess(self._decode_partial(adapter, tokens).float(), output_type)
        self.maybe_free_model_hooks()
        if not return_dict:
            return images, stats
        return ARImagePipelineOutput(images=images, stats=stats)


def size_error(family: str, height, width, allowed: str) -> ValueError:
    return ValueError(f"{family} cannot generate a {height}x{width} (height x width) image; {allowed}")


def left_padded(rows: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token id rows of different lengths -> (input_ids [B, T] long, attention_mask [B, T] long), left-padded."""
    T = max(len(row) for row in rows)
    ids = torch.tensor([[pad_id] * (T - len(row)) + row for row in rows], device=device)
    mask = torch.tensor([[0] * (T - len(row)) + [1] * len(row) for row in rows], device=device)
    return ids, mask


def load_transformers_model(model_class, path: Path, **kwargs):
    """`model_class.from_pretrained(path, **kwargs)` that refuses to fill missing weights with random values (which
    transformers does with a warning): a checkpoint lacking its VQ decoder or any other weight raises."""
    model, info = model_class.from_pretrained(path, output_loading_info=True, **kwargs)
    missing = sorted(info["missing_keys"])
    if missing:
        decoder = [key for key in missing if ".decoder." in key or "post_quant" in key]
        what = f"VQ decoder weight(s), e.g. {decoder[:3]}" if decoder else f"weight(s), e.g. {missing[:3]}"
        raise ValueError(f"{path} lacks {len(missing)} {what}: an incomplete or different checkpoint")
    return model.eval()
