"""Text-to-image with Janus / Janus-Pro (transformers' `JanusForConditionalGeneration`) through `mmspec.image`
decodings: the same call, outputs and stats as every `ARImagePipeline`."""

from __future__ import annotations

import torch
from diffusers.image_processor import VaeImageProcessor
from transformers import JanusForConditionalGeneration, PreTrainedTokenizerBase

from mmspec.core.component import DecodingComponent
from mmspec.models.hf_image import PromptCondition
from mmspec.models.janus import JanusAdapter
from mmspec.pipelines.ar_image import ARImagePipeline, left_padded, size_error

# DeepSeek's "deepseek" SFT format with an empty system prompt, as Janus builds image-generation prompts; the
# begin-of-image token follows it.
PROMPT_TEMPLATE = "<|User|>: {prompt}\n\n<|Assistant|>:"


class JanusPipeline(ARImagePipeline):
    r"""Janus / Janus-Pro text-to-image: chat-formatted prompt + begin-of-image -> image tokens (generation head,
    CFG against the prompt with every token but BOS / begin-of-image padded out) -> the VQ decoder.

    Components:
        model ([`~transformers.JanusForConditionalGeneration`]): e.g. `deepseek-community/Janus-Pro-1B` / `-7B`.
        tokenizer ([`PreTrainedTokenizerBase`]): the checkpoint's tokenizer.

    Examples:
        ```py
        >>> from mmspec import JanusPipeline

        >>> pipe = JanusPipeline.from_pretrained("path/to/Janus-Pro-7B", dtype=torch.bfloat16).to("cuda")
        >>> out = pipe("a red fox in the snow", decoding="sjd", acceptance="exact")
        >>> out.images[0].save("fox.png"); print(out.stats.table())
        ```
    """

    model_cpu_offload_seq = "model"
    checkpoint_model_class = JanusForConditionalGeneration
    checkpoint_model_type = "janus"
    default_guidance_scale = 5.0  # Janus-Pro's cfg_weight
    default_top_k = 0

    model: JanusForConditionalGeneration
    tokenizer: PreTrainedTokenizerBase

    def __init__(self, model: JanusForConditionalGeneration, tokenizer: PreTrainedTokenizerBase,
                 decoding: DecodingComponent | str | dict = "auto"):
        super().__init__()
        JanusAdapter(model)  # validates the model before anything is registered
        self.register_modules(model=model, tokenizer=tokenizer)
        self.decoding = decoding
        self.image_processor = VaeImageProcessor(do_normalize=True)

    @property
    def native_size(self) -> int:
        """The image side in pixels: the VQ grid (image_size // patch_size) times the VQ decoder's upsampling."""
        vq = self.model.config.vq_config
        return vq.num_patches * 2 ** (len(vq.channel_multiplier) - 1)

    def image_adapter(self, height: int | None = None, width: int | None = None) -> JanusAdapter:
        size = self.native_size
        height, width = height or size, width or size
        if (height, width) != (size, size):
            raise size_error("Janus", height, width, f"its VQ grid makes {size}x{size} only")
        return JanusAdapter(self.model)

    @torch.no_grad()
    def encode_prompt(self, prompts: list[str], negative_prompt: list[str] | None, adapter: JanusAdapter):
        if negative_prompt is not None:
            raise ValueError("JanusPipeline takes no negative_prompt: Janus's unconditional rows are the prompt with "
                             "every token but BOS and begin-of-image padded out")
        # Janus's SFT template strips the user's message (`apply_sft_template_for_multi_turn_prompts`)
        rows = [self.tokenizer(PROMPT_TEMPLATE.format(prompt=p.strip()))["input_ids"] + [adapter.boi]
                for p in prompts]
        return PromptCondition(*left_padded(rows, adapter.pad, self._execution_device))
