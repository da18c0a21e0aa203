"""`JanusAdapter`: the `mmspec.image.DiscreteImageModel` protocol over transformers' `JanusForConditionalGeneration`
(Janus / Janus-Pro, image generation mode), on its public modules only.

It builds what `JanusForConditionalGeneration.generate(generation_mode="image")` builds — the prompt rows, their
unconditional twins (every token but BOS and the begin-of-image token replaced by the pad token), image tokens entering
the language model through `generation_embeddings` + `generation_aligner`, logits from `generation_head` — but takes
windows of several image tokens per forward and rolls each row back on its own (`mmspec.core.cache`), which that loop
cannot. CFG rows are returned unmixed; `mmspec.core.process_logits` combines them (on logits: the same law as
transformers' CFG on log-probabilities, which differs by a constant per row).

Shapes: B samples, T prompt tokens, W window, V = the VQ codebook size, N = h * w image tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmspec.core.cache import RaggedCacheState, forward_ragged, truncate
from mmspec.image.protocol import ImageLogits


@dataclass(frozen=True)
class JanusCondition:
    """input_ids: [B, T] long, the image-generation prompts (chat template ending with the begin-of-image token),
    left-padded; attention_mask: [B, T], 1 for real tokens (None = all real)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None = None


@dataclass
class JanusState:
    """Rows [0, B) conditional, [B, 2B) their unconditional twins when cfg; prompt_lengths: [B] real prompt tokens."""

    cache: RaggedCacheState
    batch_size: int
    cfg: bool
    prompt_lengths: torch.Tensor


class JanusAdapter:
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
        self.model = model
        self.bos, self.pad, self.boi = generation.bos_token_id, generation.pad_token_id, boi
        self.grid = (side, side)
        self.vocab_size = model.config.vq_config.num_embeddings

    def unconditional(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The CFG twins of prompts [B, T]: every token but BOS and begin-of-image replaced by the pad token."""
        keep = (input_ids == self.bos) | (input_ids == self.boi)
        return input_ids.masked_fill(~keep, self.pad)

    def prefill(self, condition: JanusCondition, cfg: bool, max_window: int = 1) -> tuple[JanusState, ImageLogits]:
        ids = condition.input_ids
        mask = torch.ones_like(ids, dtype=torch.bool) if condition.attention_mask is None else \
            condition.attention_mask.bool()
        rows, valid = (torch.cat([ids, self.unconditional(ids)]), torch.cat([mask, mask])) if cfg else (ids, mask)
        state = JanusState(RaggedCacheState.empty(rows.shape[0], ids.device), ids.shape[0], cfg, mask.sum(-1))
        embeds = self.model.get_input_embeddings()(rows)
        hidden = forward_ragged(self.model.model.language_model, state.cache, valid, inputs_embeds=embeds)
        return state, self._logits(hidden.last_hidden_state[:, -1:], state)

    def forward(self, tokens: torch.Tensor, state: JanusState) -> ImageLogits:
        if tokens.ndim != 2 or tokens.shape[0] != state.batch_size:
            raise ValueError(f"tokens must have shape [{state.batch_size}, W], got {tuple(tokens.shape)}")
        rows = torch.cat([tokens, tokens]) if state.cfg else tokens  # both halves see the same image tokens
        embeds = self.model.prepare_embeddings_for_image_generation(rows)
        hidden = forward_ragged(self.model.model.language_model, state.cache, inputs_embeds=embeds)
        return self._logits(hidden.last_hidden_state, state)

    def rollback(self, state: JanusState, keep: torch.Tensor) -> None:
        lengths = state.prompt_lengths + keep
        truncate(state.cache, torch.cat([lengths, lengths]) if state.cfg else lengths)

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, N] -> images [B, 3, H, W] in about [-1, 1] (the VQ decoder's output, channels first)."""
        return self.model.decode_image_tokens(tokens).permute(0, 3, 1, 2)

    def codebook(self) -> torch.Tensor:
        """[V, d] code vectors as the quantizer compares them; for LANTERN's neighbour table."""
        return self.model.model.vqmodel.quantize.embedding.weight.detach()

    def _logits(self, hidden: torch.Tensor, state: JanusState) -> ImageLogits:
        logits = self.model.model.generation_head(hidden).float()  # [B or 2B, W, V]
        if not state.cfg:
            return ImageLogits(logits)
        return ImageLogits(logits[: state.batch_size], logits[state.batch_size :])
