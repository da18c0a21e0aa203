"""`JanusAdapter`: the `mmspec.image.DiscreteImageModel` protocol over transformers' `JanusForConditionalGeneration`
(Janus / Janus-Pro, image generation mode), on its public modules only.

It builds what `JanusForConditionalGeneration.generate(generation_mode="image")` builds — the prompt rows, their
unconditional twins (every token but BOS and the begin-of-image token replaced by the pad token), image tokens entering
the language model through `generation_embeddings` + `generation_aligner`, logits from `generation_head` — but takes
windows of several image tokens per forward and rolls each row back on its own (`mmspec.models.hf_image`), which that
loop cannot. CFG on logits is the same law as transformers' CFG on log-probabilities (they differ by a constant per
row). Local ids are the VQ codes (V = the codebook size, no structure tokens).
"""

from __future__ import annotations

import torch

from mmspec.models.hf_image import CausalLMImageAdapter, PromptCondition

JanusCondition = PromptCondition  # input_ids end with the begin-of-image token; negative_ids default to the twins


class JanusAdapter(CausalLMImageAdapter):
    def __init__(self, model):
        from transformers import JanusForConditionalGeneration

        if not isinstance(model, JanusForConditionalGeneration):
            raise TypeError(f"model must be a transformers JanusForConditionalGeneration, got {type(model).__name__}")
        generation = model.generation_config
        boi = (generation.generation_kwargs or {}).get("boi_token_id")
        missing = [name for name, value in (("bos_token_id", generation.bos_token_id),
                                            ("pad_token_id", generation.pad_token_id),
                                            ('generation_kwargs["boi_token_id"]', boi)) if value is None]
        if missing:
            raise ValueError(f"the model's generation_config lacks {missing} (Janus checkpoints ship them)")
        side = model.config.vq_config.num_patches
        if model.config.vision_config.num_image_tokens != side * side:
            raise ValueError(f"vision_config.num_image_tokens ({model.config.vision_config.num_image_tokens}) must be "
                             f"(image_size // patch_size)^2 = {side * side} for image generation")
        self.model, self.language_model = model, model.model.language_model
        self.bos, self.pad, self.boi = generation.bos_token_id, generation.pad_token_id, boi
        self.grid = (side, side)
        self.vocab_size = model.config.vq_config.num_embeddings

    def unconditional(self, input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The CFG twins of prompts [B, T]: every token but BOS and begin-of-image replaced by the pad token."""
        keep = (input_ids == self.bos) | (input_ids == self.boi)
        return input_ids.masked_fill(~keep, self.pad), mask

    def embed_image(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.prepare_embeddings_for_image_generation(tokens)

    def image_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.model.generation_head(hidden).float()

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, N] -> images [B, 3, H, W] in about [-1, 1] (the VQ decoder's output, channels first)."""
        return self.model.decode_image_tokens(tokens).permute(0, 3, 1, 2)

    def codebook(self) -> torch.Tensor:
        """[V, d] code vectors as the quantizer compares them; for LANTERN's neighbour table."""
        return self.model.model.vqmodel.quantize.embedding.weight.detach()
