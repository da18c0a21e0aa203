"""Text-to-image with Emu3-Gen (transformers' `Emu3ForConditionalGeneration`) through `mmspec.image` decodings: the
same call, outputs and stats as every `ARImagePipeline`, with CFG rows batched beside the prompts."""

from __future__ import annotations

import torch
from diffusers.image_processor import VaeImageProcessor
from transformers import Emu3ForConditionalGeneration, PreTrainedTokenizerBase

from mmspec.core.component import DecodingComponent
from mmspec.models.emu3 import Emu3Adapter
from mmspec.models.hf_image import PromptCondition
from mmspec.pipelines.ar_image import ARImagePipeline, left_padded, size_error

IMAGE_START, IMAGE_WRAPPER = "<|image start|>", "<|image token|>"  # Emu3's fixed tokens around the size text
NATIVE_SIZE = 720  # Emu3-Gen's default image area is 720 x 720 pixels
# the unconditional rows' text when the call gives none: the negative prompt of Emu3's own generation script
NEGATIVE_PROMPT = ("lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, cropped, "
                   "worst quality, low quality, normal quality, jpeg artifacts, signature, watermark, username, "
                   "blurry.")


def image_prompt(text: str, height: int, width: int) -> str:
    """Emu3's image-generation prompt for an image of height x width VQ tokens (`Emu3Processor(...,
    return_for_image_generation=True)`)."""
    return f"{text}{IMAGE_START}{height}*{width}{IMAGE_WRAPPER}"


class Emu3Pipeline(ARImagePipeline):
    r"""Emu3-Gen text-to-image: `prompt<|image start|>h*w<|image token|>` -> h rows of visual tokens closed by
    end-of-line tokens (forced at their positions) -> Emu3's VQ decoder. CFG runs the negative prompt (default: the
    one of Emu3's `image_generation.py`, `NEGATIVE_PROMPT`) with the same image prefix as batched rows. Emu3's script
    also appends " masterpiece, film grained, best quality." to every prompt; add it to yours for its images.

    Components:
        model ([`~transformers.Emu3ForConditionalGeneration`]): e.g. `BAAI/Emu3-Gen-hf`.
        tokenizer ([`PreTrainedTokenizerBase`]): the checkpoint's tokenizer.

    Examples:
        ```py
        >>> from mmspec import Emu3Pipeline

        >>> pipe = Emu3Pipeline.from_pretrained("path/to/Emu3-Gen-hf", dtype=torch.bfloat16).to("cuda")
        >>> out = pipe("a portrait of young girl. masterpiece, film grained, best quality.",
        ...            negative_prompt="lowres, bad anatomy, bad hands, text, error, worst quality, blurry.")
        >>> out.images[0].save("girl.png"); print(out.stats.table())
        ```
    """

    model_cpu_offload_seq = "model"
    checkpoint_model_class = Emu3ForConditionalGeneration
    checkpoint_model_type = "emu3"
    default_guidance_scale = 3.0  # Emu3-Gen's recommended CFG
    default_top_k = 2048  # Emu3-Gen's recommended top-k

    model: Emu3ForConditionalGeneration
    tokenizer: PreTrainedTokenizerBase

    def __init__(self, model: Emu3ForConditionalGeneration, tokenizer: PreTrainedTokenizerBase,
                 decoding: DecodingComponent | str | dict = "auto"):
        super().__init__()
        Emu3Adapter(model, 1, 1)  # validates the model before anything is registered
        self.register_modules(model=model, tokenizer=tokenizer)
        self.decoding = decoding
        self.image_processor = VaeImageProcessor(do_normalize=True)

    @property
    def pixels_per_token(self) -> int:
        return self.model.model.vqmodel.spatial_scale_factor

    def image_adapter(self, height: int | None = None, width: int | None = None) -> Emu3Adapter:
        f = self.pixels_per_token
        native = NATIVE_SIZE // f * f
        height, width = height or native, width or native
        if height % f or width % f or height < f or width < f:
            raise size_error("Emu3", height, width, f"height and width must be positive multiples of {f} pixels "
                             "(one VQ token)")
        return Emu3Adapter(self.model, height // f, width // f)

    @torch.no_grad()
    def encode_prompt(self, prompts: list[str], negative_prompt: list[str] | None, adapter: Emu3Adapter):
        negatives = negative_prompt or [NEGATIVE_PROMPT] * len(prompts)
        # BOS written out, as Emu3's processors do: its GPT-style tokenizer adds none of its own
        bos = [self.tokenizer.bos_token_id]
        rows, negative_rows = ([bos + self.tokenizer(image_prompt(text, adapter.height, adapter.width),
                                                     add_special_tokens=False)["input_ids"]
                                for text in texts] for texts in (prompts, negatives))
        longest = max(len(row) for row in rows + negative_rows) + adapter.grid[0] * adapter.grid[1] + 3
        if longest > self.model.config.text_config.max_position_embeddings:
            raise ValueError(f"prompt + image need {longest} positions; the model holds "
                             f"{self.model.config.text_config.max_position_embeddings} (make the image smaller)")
        pad, device = self.tokenizer.pad_token_id or 0, self._execution_device
        return PromptCondition(*left_padded(rows, pad, device), *left_padded(negative_rows, pad, device))
