"""Text-to-image generation with a LlamaGen-architecture AR model: text encoder -> GPT over VQ tokens -> VQ decoder.

Structure and call conventions follow diffusers' pipelines (`GlmImagePipeline`, `AmusedPipeline`); decoding runs in
`mmspec.image` and is chosen per call with `decoding=` ("sjd" = speculative Jacobi decoding, the default; "ar" = plain
sampling with a KV cache; both draw from the same law).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import closing

import torch
from diffusers import DiffusionPipeline
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.image_processor import VaeImageProcessor
from diffusers.utils import replace_example_docstring
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mmspec.core.probs import SamplingConfig
from mmspec.core.rng import Generators, check_generators
from mmspec.core.stats import SpecStats
from mmspec.image.decoding import PAD_ID, ImageDecoding
from mmspec.image.registry import get_decoding
from mmspec.models.llamagen.adapter import LlamaGenAdapter, LlamaGenCondition
from mmspec.models.llamagen.gpt import LlamaGenTransformer
from mmspec.models.llamagen.vq import LlamaGenVQModel
from pipelines.llamagen.pipeline_output import ARImagePipelineOutput

logger = logging.getLogger(__name__)

OUTPUT_TYPES = ("pil", "np", "pt", "latent")

EXAMPLE_DOC_STRING = """
    Examples:
        ```py
        >>> import torch
        >>> from mmspec.zoo import zoo_path
        >>> from pipelines.llamagen import LlamaGenPipeline

        >>> pipe = LlamaGenPipeline.from_pretrained(zoo_path("shapes"))
        >>> out = pipe("two small red triangles above a blue circle on a striped background",
        ...            generator=torch.Generator().manual_seed(0))
        >>> out.images[0].save("shapes.png")
        >>> print(out.stats.table())
        ```
"""


class LlamaGenPipeline(DiffusionPipeline):
    r"""Text-to-image AR generation: prompt -> text states -> image tokens (GPT, classifier-free guidance) -> pixels.

    Components:
        transformer ([`LlamaGenTransformer`]): the t2i GPT over VQ codes.
        vqvae ([`LlamaGenVQModel`]): the VQ tokenizer whose decoder turns codes into pixels.
        tokenizer ([`PreTrainedTokenizerBase`]): the text encoder's tokenizer.
        text_encoder ([`PreTrainedModel`]): an encoder whose `last_hidden_state` [B, T, caption_dim] conditions the
            GPT (the embedded model uses a small T5 encoder; LlamaGen's FLAN-T5-XL plugs in the same way).
        draft_transformer ([`LlamaGenTransformer`], *optional*): a small t2i GPT over the same codes and text states,
            the drafter of `decoding="draft"`.
    """

    model_cpu_offload_seq = "text_encoder->transformer->vqvae"
    _optional_components = ["draft_transformer"]
    _callback_tensor_inputs = ["tokens", "n_committed"]

    transformer: LlamaGenTransformer
    vqvae: LlamaGenVQModel
    tokenizer: PreTrainedTokenizerBase
    text_encoder: PreTrainedModel
    draft_transformer: LlamaGenTransformer | None

    def __init__(self, transformer: LlamaGenTransformer, vqvae: LlamaGenVQModel, tokenizer: PreTrainedTokenizerBase,
                 text_encoder: PreTrainedModel, draft_transformer: LlamaGenTransformer | None = None):
        super().__init__()
        for name, model in (("transformer", transformer), ("draft_transformer", draft_transformer)):
            if model is not None and model.config.model_type != "t2i":
                raise ValueError(f"LlamaGenPipeline needs a t2i {name}, got model_type={model.config.model_type!r}")
        self.register_modules(transformer=transformer, vqvae=vqvae, tokenizer=tokenizer, text_encoder=text_encoder,
                              draft_transformer=draft_transformer)
        self.image_processor = VaeImageProcessor(vae_scale_factor=vqvae.downsample_factor, do_normalize=True)

    @property
    def guidance_scale(self) -> float:
        return self._guidance_scale

    @property
    def do_classifier_free_guidance(self) -> bool:
        return self._guidance_scale != 1.0

    @property
    def num_timesteps(self) -> int:
        return self.transformer.num_image_tokens

    @property
    def interrupt(self) -> bool:
        return self._interrupt

    @property
    def text_context(self) -> int:
        """Text tokens the transformer's condition prefix holds."""
        return self.transformer.config.cls_token_num

    def check_inputs(self, prompt, num_images_per_prompt, generator, output_type, callback_on_step_end_tensor_inputs):
        if isinstance(prompt, str):
            prompt = [prompt]
        if not isinstance(prompt, list) or not all(isinstance(p, str) for p in prompt):
            raise TypeError(f"prompt must be a str or a list of str, got {type(prompt).__name__}")
        if not prompt:
            raise ValueError("prompt is an empty list; pass at least one prompt")
        if isinstance(num_images_per_prompt, bool) or not isinstance(num_images_per_prompt, int):
            raise TypeError(f"num_images_per_prompt must be an int, got {type(num_images_per_prompt).__name__}")
        if num_images_per_prompt < 1:
            raise ValueError(f"num_images_per_prompt must be >= 1, got {num_images_per_prompt}")
        check_generators(generator, len(prompt) * num_images_per_prompt)
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type must be one of {OUTPUT_TYPES}, got {output_type!r}")
        unknown = set(callback_on_step_end_tensor_inputs or ()) - set(self._callback_tensor_inputs)
        if unknown:
            raise ValueError(
                f"callback_on_step_end_tensor_inputs {sorted(unknown)} are not in {self._callback_tensor_inputs}"
            )
        return prompt

    def encode_prompt(self, prompt: list[str], device: torch.device) -> LlamaGenCondition:
        """Text states [B, T, caption_dim] left-padded to the transformer's T condition slots, with their mask."""
        # max_length padding neither truncates nor pads a longer prompt, so its row length exposes it
        encoded = self.tokenizer(prompt, padding="max_length", max_length=self.text_context, padding_side="left")
        for text, ids in zip(prompt, encoded["input_ids"], strict=True):
            if len(ids) > self.text_context:
                raise ValueError(
                    f"prompt {text!r} is {len(ids)} tokens long; the model's text context holds {self.text_context}"
                )
        input_ids, mask = torch.tensor(encoded["input_ids"]), torch.tensor(encoded["attention_mask"])
        unk = self.tokenizer.unk_token_id
        if unk is not None and (input_ids == unk).any():
            logger.warning("some prompt words are not in the text encoder's vocabulary and were read as %s",
                           self.tokenizer.unk_token)
        input_ids, mask = input_ids.to(device), mask.to(device)
        states = self.text_encoder(input_ids=input_ids, attention_mask=mask).last_hidden_state
        return LlamaGenCondition(states.to(self.transformer.dtype), mask.bool())

    def _decode_partial(self, tokens: torch.Tensor) -> torch.Tensor:
        """Pixels [B, 3, H, W] in [-1, 1] of tokens [B, N] with PAD_ID where not generated (an interrupted run):
        generated cells are decoded, the rest shown mid-grey."""
        h, w = self.transformer.config.grid_size, self.transformer.config.grid_size
        missing = tokens == PAD_ID
        images = self.vqvae.decode(tokens.masked_fill(missing, 0), (h, w))
        if missing.any():
            scale = images.shape[-1] // w
            cell_mask = missing.view(-1, 1, h, w).repeat_interleave(scale, 2).repeat_interleave(scale, 3)
            images = images.masked_fill(cell_mask, 0.0)
        return images

    @torch.no_grad()
    def decode_tokens(self, tokens: torch.Tensor, output_type: str = "pil"):
        """Images of image-token ids [B, h*w] as `output_type="latent"` returns them (PAD_ID cells mid-grey): PIL
        images (`"pil"`), an NHWC float array (`"np"`) or an NCHW float tensor (`"pt"`) in [0, 1]."""
        if output_type not in OUTPUT_TYPES or output_type == "latent":
            raise ValueError(f"output_type must be one of {[t for t in OUTPUT_TYPES if t != 'latent']}, got "
                             f"{output_type!r}")
        return self.image_processor.postprocess(self._decode_partial(tokens).float(), output_type=output_type)

    @torch.no_grad()
    @replace_example_docstring(EXAMPLE_DOC_STRING)
    def __call__(
        self,
        prompt: str | list[str],
        num_images_per_prompt: int = 1,
        guidance_scale: float = 3.0,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        generator: Generators = None,
        output_type: str = "pil",
        return_dict: bool = True,
        callback_on_step_end: Callable | PipelineCallback | MultiPipelineCallbacks | None = None,
        callback_on_step_end_tensor_inputs: list[str] | None = None,
        decoding: str | ImageDecoding = "sjd",
        window: int | None = None,
        init: str | None = None,
        coupling: str | None = None,
        draft_length: int | None = None,
        acceptance: str | None = None,
        lantern_k: int | None = None,
        lantern_delta: float | None = None,
        lantern_lam: float | None = None,
    ) -> ARImagePipelineOutput | tuple:
        r"""Generate images from text.

        Args:
            prompt (`str` or `list[str]`): what to draw; every prompt must fit the text context (`self.text_context`
                tokens).
            num_images_per_prompt (`int`, defaults to 1): images per prompt; the batch is prompts x this.
            guidance_scale (`float`, defaults to 3.0): classifier-free guidance scale s >= 0, combined on logits as
                `uncond + s * (cond - uncond)` before temperature / top-k / top-p; 1.0 turns guidance off (no
                unconditional rows are run).
            temperature (`float`, defaults to 1.0): softmax temperature; 0 = greedy.
            top_k (`int`, defaults to 0): keep the k most likely codes; 0 = all.
            top_p (`float`, defaults to 1.0): nucleus sampling mass; 1.0 = off.
            generator (`torch.Generator` or `list[torch.Generator]`, *optional*): one generator for the batch, or one
                per image (prompts x num_images_per_prompt), which makes each image depend on its own seed only.
            output_type (`str`, defaults to `"pil"`): `"pil"`, `"np"` (NHWC in [0, 1]), `"pt"` (NCHW in [0, 1]) or
                `"latent"` (the image token ids [B, h*w]).
            return_dict (`bool`, defaults to `True`): return an [`ARImagePipelineOutput`] instead of a tuple
                `(images, stats)`.
            callback_on_step_end (`Callable`, *optional*): called after every target forward as
                `callback_on_step_end(pipe, step, n_generated, callback_kwargs)`; `callback_kwargs` holds the tensors
                named in `callback_on_step_end_tensor_inputs` (`"tokens"`: [B, N] with -1 where not generated yet,
                `"n_committed"`: [B]). They are read-only: committed tokens already sit in the KV cache. Set
                `pipe._interrupt = True` to stop early; unfinished cells are then shown grey (or -1 in latents).
            callback_on_step_end_tensor_inputs (`list[str]`, *optional*): see above; defaults to `["tokens"]`.
            decoding (`str` or decoding object, defaults to `"sjd"`): how tokens are generated, see
                `mmspec.image.DECODINGS`: `"sjd"` (speculative Jacobi decoding, lossless: the same output law as
                `"ar"` in fewer target forwards), `"draft"` (the pipeline's `draft_transformer` drafts, the target
                verifies) or `"ar"` (one token per target forward).
            window (`int`, *optional*): `"sjd"` only: tokens scored per target forward (`SJDDecoding` default).
            init (`str`, *optional*): `"sjd"` only: how positions no window has reached are drafted, `"random"`,
                `"horizontal"` or `"vertical"`.
            coupling (`str`, *optional*): `"sjd"` only: how drafts are redrafted between iterations, `"none"`
                (original SJD), `"maximal"` (MC-SJD, = SJD-PAC's adaptive continuation) or `"gumbel"`.
            draft_length (`int`, *optional*): `"draft"` only: tokens drafted per target forward.
            acceptance (`str`, *optional*): `"sjd"` / `"draft"`: `"exact"` (default, lossless) or `"lantern"`
                (LANTERN relaxed acceptance over codebook neighbours: faster, lossy; `stats.excess_acceptance` reports
                the realised distortion, the per-position TV distance of the output law from the model's).
            lantern_k (`int`, *optional*): `"lantern"`: nearest codes that may join a draft's neighbourhood
                (default min(1000, V - 1)).
            lantern_delta (`float`, *optional*): `"lantern"`: LANTERN's TV budget per candidate, in [0, 1] (default
                0.1 when `lantern_lam` is not given).
            lantern_lam (`float`, *optional*): `"lantern"`: LANTERN++'s budget, neighbourhood mass <= lam * p(x),
                lam >= 1.

        Examples:
        """
        # 1. Check inputs
        if isinstance(callback_on_step_end, (PipelineCallback, MultiPipelineCallbacks)):
            callback_on_step_end_tensor_inputs = callback_on_step_end.tensor_inputs
        tensor_inputs = callback_on_step_end_tensor_inputs or ["tokens"]
        prompts = self.check_inputs(prompt, num_images_per_prompt, generator, output_type, tensor_inputs)
        sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, guidance_scale=guidance_scale)
        drafter = None
        if decoding == "draft" and self.draft_transformer is not None:
            drafter = LlamaGenAdapter(self.draft_transformer, self.vqvae)
        decoder = get_decoding(decoding, window=window, init=init, coupling=coupling, drafter=drafter,
                               draft_length=draft_length, acceptance=acceptance, lantern_k=lantern_k,
                               lantern_delta=lantern_delta, lantern_lam=lantern_lam)
        self._guidance_scale, self._interrupt = guidance_scale, False
        device = self._execution_device

        # 2. Encode the prompts, one condition row per image
        condition = self.encode_prompt(prompts, device)
        condition = LlamaGenCondition(
            condition.states.repeat_interleave(num_images_per_prompt, 0),
            condition.mask.repeat_interleave(num_images_per_prompt, 0),
        )

        # 3. Decode image tokens
        adapter = LlamaGenAdapter(self.transformer, self.vqvae)
        stats = SpecStats()
        tokens = None
        steps = decoder(adapter, condition, sampling, generator, stats)
        with self.progress_bar(total=self.num_timesteps) as progress, closing(steps):
            done = 0
            for step in steps:
                tokens = step.tokens
                if callback_on_step_end is not None:
                    self._run_callback(callback_on_step_end, step, tensor_inputs)
                progress.update(step.min_committed - done)
                done = step.min_committed
                if self._interrupt:
                    break

        # 4. Post-process
        images = tokens if output_type == "latent" else self.decode_tokens(tokens, output_type)
        self.maybe_free_model_hooks()
        if not return_dict:
            return images, stats
        return ARImagePipelineOutput(images=images, stats=stats)

    def _run_callback(self, callback, step, tensor_inputs: list[str]) -> None:
        callback_kwargs = {name: getattr(step, name) for name in tensor_inputs}
        returned = callback(self, step.step, step.min_committed, dict(callback_kwargs)) or {}
        replaced = [name for name, value in returned.items()
                    if name in callback_kwargs and value is not callback_kwargs[name]]
        if replaced:
            raise ValueError(
                f"callback_on_step_end returned new {replaced}: an AR pipeline's committed tokens are read-only "
                "(they already sit in the KV cache)"
            )


