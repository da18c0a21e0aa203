"""`Emu3Adapter`: the `mmspec.image.DiscreteImageModel` protocol over transformers' `Emu3ForConditionalGeneration`
(Emu3-Gen), on its public modules only.

Emu3 writes an image of h x w VQ codes as text-vocabulary tokens after the prompt `... <|image start|>{h}*{w}<|image
token|>`: h rows of w visual tokens (`<|visual tokenNNNNNN|>`, BPE ids in the vocabulary map), each row closed by the
end-of-line token `<|extra_200|>`, then end-of-frame / end-of-image / EOS. transformers generates it with the standard
`generate`, a user `prefix_allowed_tokens_fn` for that structure, and CFG as an extra unbatched forward per step
(`negative_prompt_ids`). Here the image span is the grid (h, w + 1): local ids 0..C-1 are the codes (code c = BPE id
`img2bpe[c]`), id C is end-of-line, forced on the last column (`forced_tokens`) so it lands at its absolute position
inside any Jacobi window; CFG rows run batched beside the prompts. End-of-frame and after are not part of the span.
"""

from __future__ import annotations

import torch

from mmspec.models.hf_image import CausalLMImageAdapter, restricted_logits, structured_span


class Emu3Adapter(CausalLMImageAdapter):
    """`height`, `width`: the image in VQ tokens (pixels / 8 for Emu3-Gen); the prompt must announce the same size
    (`Emu3Processor(..., return_for_image_generation=True)` writes `{h}*{w}`)."""

    def __init__(self, model, height: int, width: int):
        from transformers import Emu3ForConditionalGeneration

        if not isinstance(model, Emu3ForConditionalGeneration):
            raise TypeError(f"model must be a transformers Emu3ForConditionalGeneration, got {type(model).__name__}")
        for name, value in (("height", height), ("width", width)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int (VQ tokens), got {value!r}")
        mapping = model.vocabulary_mapping
        n_codes = model.config.vq_config.codebook_size
        missing = sorted(set(range(n_codes)) - set(mapping.img2bpe))
        if missing or mapping.eol_token_id is None:
            raise ValueError(
                f"the model's vocabulary_map must name every visual token <|visual token%06d|> 0..{n_codes - 1} and "
                f"<|extra_200|> (end of line); missing codes {missing[:5]}{'...' if len(missing) > 5 else ''}"
                f"{'' if mapping.eol_token_id is not None else ' and <|extra_200|>'}"
            )
        self.model, self.language_model = model, model.model.text_model
        self.height, self.width, self.n_codes = height, width, n_codes
        self.grid = (height, width + 1)
        self.vocab_size = n_codes + 1
        self.eol = n_codes
        device = model.lm_head.weight.device
        self.forced_tokens = structured_span(height, width, self.eol).to(device)
        self.token_ids = torch.tensor([mapping.img2bpe[c] for c in range(n_codes)] + [mapping.eol_token_id],
                                      device=device)  # [V], BPE id of each local id
        self.codebook_token_ids = torch.arange(n_codes)

    def unconditional(self, input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' default without `negative_prompt_ids`: the last prompt token alone (the image wrapper)."""
        return input_ids[:, -1:], mask[:, -1:]

    def embed_image(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(self.token_ids[tokens])

    def image_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return restricted_logits(self.model.lm_head(hidden), self.token_ids, self.n_codes)

    def to_bpe(self, tokens: torch.Tensor) -> torch.Tensor:
        """Local ids [B, N] -> the BPE ids transformers' loop writes for the same image span."""
        return self.token_ids[tokens]

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, h * (w + 1)] -> images [B, 3, 8h, 8w] in about [-1, 1] (Emu3's VQ decoder, one frame)."""
        codes = tokens.view(-1, self.height, self.width + 1)[..., : self.width]
        return self.model.model.vqmodel.decode(codes)

    def codebook(self) -> torch.Tensor:
        """[C, d] code vectors as the quantizer compares them (plain L2); for LANTERN's neighbour table."""
        return self.model.model.vqmodel.quantize.embedding.weight.detach()
