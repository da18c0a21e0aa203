"""Lumina-mGPT (Liu et al. 2024, arXiv 2408.02657; `Alpha-VLLM/Lumina-mGPT`) on transformers 5's Chameleon classes.

Lumina-mGPT is a Chameleon decoder fine-tuned to write images: after the prompt "Generate an image of {W}x{H} according
to the following prompt:\\n{caption}" (plus the turn separator `<reserved08706>`) it emits the image-start token
`<racm3:break>`, two grid tokens `<reserved{8800+n}>` (height and width in 32-pixel patches), then h rows of w image
tokens (VQ codes at 16x16 pixels, BPE names `IMGIMG...Z`) each closed by the new-line token `<reserved08799>`, then the
image-end token `<eoss>`. Its CFG starts at the image-start token: the unconditional row is the image-start and grid
tokens alone, with no text. transformers' Chameleon cannot produce these images: its forward sets every image-token
logit to the float minimum and its `ChameleonVQVAE` has no decoder. So this module provides

- `LuminaMGPTForConditionalGeneration`: Chameleon with image-token logits left as they are (what the official fork's
  `ChameleonXLLMXForConditionalGeneration` computes), for `generate`;
- `LuminaImageLogitsProcessors`: the official loop's three processors — image-start-triggered CFG, the image structure
  (image tokens only, forced new-lines and image end), image / text top-k — as our own transformers 5
  `LogitsProcessor`s (the originals subclass the removed `LogitsWarper` and read only row 0 of the batch);
- `LuminaMGPTAdapter`: the `mmspec.image.DiscreteImageModel` protocol (batched CFG, forced new-lines as structure
  tokens inside any Jacobi window), decoding with `mmspec.models.chameleon_vqgan.ChameleonVQGAN`.

Shapes: B samples, h x w the image in VQ tokens (pixels / 16), C codes, local ids 0..C-1 codes and C the new-line.
"""

from __future__ import annotations

import torch
from transformers import (
    ChameleonForConditionalGeneration,
    DynamicCache,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,  # noqa: F401  diffusers finds a saved component's loader among the names this module holds
)

from mmspec.adapters.causal_lm import cache_keyword
from mmspec.models.chameleon_vqgan import ChameleonVQGAN
from mmspec.models.hf_image import LineStructuredAdapter

IMAGE_START, IMAGE_END, NEW_LINE, TURN_SEPARATOR = "<racm3:break>", "<eoss>", "<reserved08799>", "<reserved08706>"
PATCH = 32  # pixels per grid token (2 x 2 VQ tokens of 16 pixels)


def grid_token(n: int) -> str:
    """The name of the grid token for n patches."""
    return f"<reserved{8800 + n:05d}>"


def lumina_prompt(caption: str, height: int, width: int) -> str:
    """Lumina-mGPT's image-generation turn for an image of height x width pixels (BOS is added by the tokenizer)."""
    return f"Generate an image of {width}x{height} according to the following prompt:\n{caption}{TURN_SEPARATOR}"


def supported_sizes(target_size: int, patch: int = PATCH, max_ratio: float = 4.0) -> list[tuple[int, int]]:
    """The (height, width) pixel sizes a Lumina-mGPT checkpoint trained at `target_size` generates (its
    `generate_crop_size_list`): walking the width w down from (target_size / patch)^2 patches while the height h grows
    as far as h * w <= that budget, every (h, w) with aspect ratio <= max_ratio, in multiples of `patch` pixels."""
    patches = (target_size // patch) ** 2
    sizes, w, h = [], patches, 1
    while w > 0:
        if max(w, h) / min(w, h) <= max_ratio:
            sizes.append((h * patch, w * patch))
        if (h + 1) * w <= patches:
            h += 1
        else:
            w -= 1
    return sizes


class LuminaMGPTForConditionalGeneration(ChameleonForConditionalGeneration):
    """Chameleon whose image-token logits are left as the LM head computes them (the official checkpoints'
    `ChameleonXLLMXForConditionalGeneration`)."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                use_cache=None, logits_to_keep: int = 0, past_key_values=None, **kwargs):
        from transformers.modeling_outputs import CausalLMOutputWithPast

        keyword = cache_keyword(self.model)  # `cache` since transformers 5.24, `past_key_values` before
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             inputs_embeds=inputs_embeds, use_cache=use_cache,
                             **{keyword: cache if cache is not None else past_key_values}, **kwargs)
        hidden = outputs.last_hidden_state[:, -logits_to_keep:] if logits_to_keep else outputs.last_hidden_state
        return CausalLMOutputWithPast(logits=self.lm_head(hidden), **{keyword: getattr(outputs, keyword)})


class LuminaTokens:
    """The special token ids of a Chameleon vocabulary map (`config.vocabulary_map`) Lumina-mGPT writes images with."""

    def __init__(self, vocabulary_map: dict[str, int] | None):
        vocab = vocabulary_map or {}
        missing = [name for name in (IMAGE_START, IMAGE_END, NEW_LINE) if name not in vocab]
        if missing:
            raise ValueError(f"the model's vocabulary_map lacks {missing}: not a Chameleon / Lumina-mGPT vocabulary")
        self.image_start, self.image_end, self.new_line = vocab[IMAGE_START], vocab[IMAGE_END], vocab[NEW_LINE]
        self.grid_ids = {n: vocab[grid_token(n)] for n in range(1, 200) if grid_token(n) in vocab}  # n -> id

    def grid_id(self, n: int) -> int:
        if n not in self.grid_ids:
            raise ValueError(f"the vocabulary has no grid token {grid_token(n)} for {n} patches")
        return self.grid_ids[n]


def image_position(input_ids: torch.Tensor, tokens: LuminaTokens) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of input_ids [B, L]: (inside [B] bool — an image was started and not ended; offset [B] long — tokens
    written since the image-start token, itself excluded)."""
    started = (input_ids == tokens.image_start).long()
    inside = started.sum(-1) > (input_ids == tokens.image_end).long().sum(-1)
    last_start = torch.where(started.bool(), torch.arange(input_ids.shape[1], device=input_ids.device), -1).amax(-1)
    return inside, input_ids.shape[1] - 1 - last_start


class ImageStartTriggeredCFG(LogitsProcessor):
    """CFG that starts once a row has written image-start + its two grid tokens: the unconditional context is those
    three tokens alone, then every token the row writes after them (own cache, one extra forward per step). Rows must
    enter the image together (equal-length prompts, as Lumina-mGPT generates)."""

    def __init__(self, model, guidance_scale: float, tokens: LuminaTokens):
        self.model, self.guidance_scale, self.tokens = model, guidance_scale, tokens
        self.cache = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        inside, offset = image_position(input_ids, self.tokens)
        guided = inside & (offset >= 2)
        if not guided.any():
            self.cache = None
            return scores
        if not guided.all() or offset.unique().numel() != 1:
            raise ValueError("ImageStartTriggeredCFG needs every row of the batch inside the same image step")
        if self.cache is None:
            self.cache = DynamicCache(config=self.model.config)
            context = input_ids[:, -int(offset[0]) - 1 :]  # image start, grid tokens (and anything after)
        else:
            context = input_ids[:, -1:]
        uncond = self.model(context, use_cache=True, **{cache_keyword(self.model): self.cache}).logits[:, -1]
        uncond = uncond.to(scores.dtype)
        return uncond + self.guidance_scale * (scores - uncond)


class ImageStructure(LogitsProcessor):
    """Inside an image (after its grid tokens): image tokens only, a new-line after every `w` of them, image-end after
    `h` lines — per row, with h, w read from the row's grid tokens."""

    def __init__(self, tokens: LuminaTokens, image_token_ids: torch.Tensor, vocab_size: int):
        self.tokens = tokens
        self.suppressed = torch.full((vocab_size,), True)
        self.suppressed[image_token_ids] = False
        self.patches_of = torch.zeros(vocab_size, dtype=torch.long)  # grid token id -> patches, else 0
        self.patches_of[list(tokens.grid_ids.values())] = torch.tensor(list(tokens.grid_ids))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        inside, offset = image_position(input_ids, self.tokens)
        active = inside & (offset >= 2)
        if not active.any():
            return scores
        L, rows = input_ids.shape[1], torch.arange(input_ids.shape[0], device=input_ids.device)
        start = (L - 1 - offset).clamp(min=0, max=L - 3)  # the image-start column (any column for inactive rows)
        patches_of = self.patches_of.to(input_ids.device)
        h, w = 2 * patches_of[input_ids[rows, start + 1]], 2 * patches_of[input_ids[rows, start + 2]]
        written = offset - 2  # image-span tokens so far
        forced = torch.where(written == h * (w + 1), self.tokens.image_end,
                             torch.where((written + 1) % (w + 1) == 0, self.tokens.new_line, -1))
        one_hot = torch.full_like(scores, float("-inf")).scatter(-1, forced.clamp(min=0)[:, None], 0.0)
        image = scores.masked_fill(self.suppressed.to(scores.device), float("-inf"))
        return torch.where(active[:, None], torch.where((forced >= 0)[:, None], one_hot, image), scores)


class InterleavedTopK(LogitsProcessor):
    """top-k with `image_top_k` inside an image and `text_top_k` elsewhere, per row."""

    def __init__(self, tokens: LuminaTokens, image_top_k: int, text_top_k: int):
        for name, k in (("image_top_k", image_top_k), ("text_top_k", text_top_k)):
            if isinstance(k, bool) or not isinstance(k, int) or k < 1:
                raise ValueError(f"{name} must be a positive int, got {k!r}")
        self.tokens, self.image_top_k, self.text_top_k = tokens, image_top_k, text_top_k

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        inside, _ = image_position(input_ids, self.tokens)
        V = scores.shape[-1]
        k = torch.where(inside, min(self.image_top_k, V), min(self.text_top_k, V))  # [B]
        kth = scores.sort(-1, descending=True).values.gather(-1, (k - 1)[:, None])
        return scores.masked_fill(scores < kth, float("-inf"))


def lumina_logits_processors(model, guidance_scale: float = 4.0, image_top_k: int = 2000,
                             text_top_k: int = 10) -> LogitsProcessorList:
    """The official loop's processors in its order (CFG, structure, top-k) for `model.generate(...,
    logits_processor=...)` with a `LuminaMGPTForConditionalGeneration`; build a fresh list per generate call."""
    tokens = LuminaTokens(model.config.vocabulary_map)
    image_ids = torch.tensor(model.model.vocabulary_mapping.image_tokens)
    processors = [ImageStructure(tokens, image_ids, model.config.vocab_size),
                  InterleavedTopK(tokens, image_top_k, text_top_k)]
    if guidance_scale != 1:
        processors.insert(0, ImageStartTriggeredCFG(model, guidance_scale, tokens))
    return LogitsProcessorList(processors)


class LuminaMGPTAdapter(LineStructuredAdapter):
    """`height`, `width`: the image in VQ tokens (pixels / 16), even (whole 32-pixel patches). Conditions are
    `PromptCondition`s whose rows end with `prompt_suffix` (image start, grid tokens); their unconditional rows default
    to that suffix alone (Lumina-mGPT's image-start-triggered CFG)."""

    def __init__(self, model, vqgan: ChameleonVQGAN, height: int, width: int):
        if not isinstance(model, ChameleonForConditionalGeneration):
            raise TypeError(f"model must be a transformers ChameleonForConditionalGeneration (Lumina-mGPT), got "
                            f"{type(model).__name__}")
        if not isinstance(vqgan, ChameleonVQGAN):
            raise TypeError(f"vqgan must be a ChameleonVQGAN, got {type(vqgan).__name__}")
        for name, value in (("height", height), ("width", width)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 2 or value % 2:
                raise ValueError(f"{name} must be an even int >= 2 (VQ tokens; 2 per 32-pixel patch), got {value!r}")
        self.tokens = LuminaTokens(model.config.vocabulary_map)
        mapping = model.model.vocabulary_mapping
        n_codes = vqgan.config.n_embed
        missing = sorted(set(range(n_codes)) - set(mapping.img2bpe))
        if missing:
            raise ValueError(f"the model's vocabulary has no IMGIMG token for codes {missing[:5]} of the VQGAN's "
                             f"{n_codes}: the VQGAN does not belong to this model")
        self.model, self.language_model, self.vqgan = model, model.model, vqgan
        self.set_span(height, width, [mapping.img2bpe[c] for c in range(n_codes)], self.tokens.new_line)
        self.prompt_suffix = torch.tensor([self.tokens.image_start, self.tokens.grid_id(height // 2),
                                           self.tokens.grid_id(width // 2)], device=self.token_ids.device)

    def prefill(self, condition, cfg: bool, max_window: int = 1):
        if not (condition.input_ids[:, -3:] == self.prompt_suffix).all():
            raise ValueError("every prompt row must end with the image-start and grid tokens (adapter.prompt_suffix) "
                             f"for a {self.height}x{self.width}-token image")
        return super().prefill(condition, cfg, max_window)

    def unconditional(self, input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return input_ids[:, -3:], mask[:, -3:]

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, h * (w + 1)] -> images [B, 3, 16h, 16w] in about [-1, 1]."""
        return self.vqgan.decode(self.codes(tokens))

    def codebook(self) -> torch.Tensor:
        """[C, d] the VQGAN's code vectors (plain L2, as its quantizer compares them); for LANTERN."""
        return self.vqgan.quantize.embedding.weight.detach()
