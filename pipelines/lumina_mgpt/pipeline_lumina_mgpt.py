"""Text-to-image with Lumina-mGPT (Chameleon weights, our `LuminaMGPTForConditionalGeneration` and Meta's VQGAN decoder)
through `mmspec.image` decodings: the same call, outputs and stats as every `ARImagePipeline`."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers.image_processor import VaeImageProcessor
from transformers import ChameleonForConditionalGeneration, PreTrainedTokenizerBase

from mmspec.core.component import DecodingComponent
from mmspec.models.chameleon_vqgan import ChameleonVQGAN
from mmspec.models.hf_image import PromptCondition
from mmspec.models.lumina_mgpt import (
    LuminaMGPTAdapter,
    LuminaMGPTForConditionalGeneration,
    lumina_prompt,
    supported_sizes,
)
from mmspec.pipelines.ar_image import ARImagePipeline, left_padded, load_transformers_model, size_error


class LuminaMGPTPipeline(ARImagePipeline):
    r"""Lumina-mGPT text-to-image: "Generate an image of WxH according to the following prompt: ..." + image-start
    and grid tokens -> rows of image tokens closed by new-lines (forced at their positions), CFG against the image-start
    and grid tokens alone -> Chameleon's VQGAN decoder.

    Components:
        model ([`LuminaMGPTForConditionalGeneration`]): e.g. `Alpha-VLLM/Lumina-mGPT-7B-768` (a Chameleon checkpoint).
        tokenizer ([`PreTrainedTokenizerBase`]): the checkpoint's (Chameleon) tokenizer.
        vqgan ([`ChameleonVQGAN`]): the decoder of Meta's `tokenizer/vqgan.ckpt`.
        target_size (`int`): the resolution the checkpoint was trained at (512, 768 or 1024); fixes its sizes.

    Examples:
        ```py
        >>> from mmspec.models.chameleon_vqgan import ChameleonVQGAN
        >>> from mmspec import LuminaMGPTPipeline

        >>> pipe = LuminaMGPTPipeline.from_pretrained("path/to/Lumina-mGPT-7B-768", target_size=768,
        ...                                           vqgan="ckpts/chameleon/tokenizer/vqgan.ckpt",
        ...                                           dtype=torch.bfloat16).to("cuda")
        >>> out = pipe("a cat on a windowsill at sunset", decoding="sjd")
        >>> out.images[0].save("cat.png"); print(out.stats.table())
        ```
    """

    model_cpu_offload_seq = "model->vqgan"
    checkpoint_model_type = "chameleon"
    default_guidance_scale = 4.0  # Lumina-mGPT's demo defaults: cfg 4, image top-k 2000
    default_top_k = 2000

    model: ChameleonForConditionalGeneration
    tokenizer: PreTrainedTokenizerBase
    vqgan: ChameleonVQGAN

    def __init__(self, model: ChameleonForConditionalGeneration, tokenizer: PreTrainedTokenizerBase,
                 vqgan: ChameleonVQGAN, target_size: int = 768, decoding: DecodingComponent | str | dict = "auto"):
        super().__init__()
        LuminaMGPTAdapter(model, vqgan, 2, 2)  # validates the pair before anything is registered
        self.register_modules(model=model, tokenizer=tokenizer, vqgan=vqgan)
        self.register_to_config(target_size=target_size)
        self.decoding = decoding
        self.image_processor = VaeImageProcessor(do_normalize=True)

    @property
    def sizes(self) -> list[tuple[int, int]]:
        """The (height, width) pixel sizes the checkpoint generates."""
        return supported_sizes(self.config.target_size, patch=2 * self.vqgan.downsample_factor)

    def image_adapter(self, height: int | None = None, width: int | None = None) -> LuminaMGPTAdapter:
        height, width = height or self.config.target_size, width or self.config.target_size
        if (height, width) not in self.sizes:
            square = [f"{h}x{w}" for h, w in self.sizes if h == w]
            raise size_error("Lumina-mGPT", height, width, f"at target_size {self.config.target_size} it makes "
                             f"{len(self.sizes)} sizes (pipe.sizes), e.g. {square}")
        f = self.vqgan.downsample_factor
        return LuminaMGPTAdapter(self.model, self.vqgan, height // f, width // f)

    @torch.no_grad()
    def encode_prompt(self, prompts: list[str], negative_prompt: list[str] | None, adapter: LuminaMGPTAdapter):
        if negative_prompt is not None:
            raise ValueError("LuminaMGPTPipeline takes no negative_prompt: Lumina-mGPT's unconditional rows are the "
                             "image-start and grid tokens alone")
        f, suffix = self.vqgan.downsample_factor, adapter.prompt_suffix.tolist()
        rows = [self.tokenizer(lumina_prompt(p, adapter.height * f, adapter.width * f))["input_ids"] + suffix
                for p in prompts]
        return PromptCondition(*left_padded(rows, self.tokenizer.pad_token_id or 0, self._execution_device))

    @classmethod
    def from_checkpoint_dir(cls, path: Path, vqgan: ChameleonVQGAN | str | Path | None = None, target_size: int = 768,
                            dtype: torch.dtype | None = None, **kwargs) -> LuminaMGPTPipeline:
        """`vqgan`: a `ChameleonVQGAN` or the path of Meta's `vqgan.ckpt` (its `vqgan.yaml` beside it is read when
        present)."""
        from transformers import AutoTokenizer

        if vqgan is None:
            raise ValueError("Lumina-mGPT checkpoints hold no image decoder: pass vqgan= (Meta's Chameleon "
                             "tokenizer/vqgan.ckpt or a ChameleonVQGAN)")
        if not isinstance(vqgan, ChameleonVQGAN):
            config = Path(vqgan).with_suffix(".yaml")
            vqgan = ChameleonVQGAN.from_chameleon_checkpoint(vqgan, config if config.is_file() else None)
        model = load_transformers_model(LuminaMGPTForConditionalGeneration, path, dtype=dtype, **kwargs)
        return cls(model, AutoTokenizer.from_pretrained(path), vqgan.to(dtype=model.dtype), target_size)
