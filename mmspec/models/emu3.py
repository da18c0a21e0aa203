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

from mmspec.models.hf_image import LineStructuredAdapter


class Emu3Adapter(LineStructuredAdapter):
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
        self.set_span(height, width, [mapping.img2bpe[c] for c in range(n_codes)], mapping.eol_token_id)

    def unconditional(self, input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' default without `negative_prompt_ids`: the last prompt token alone (the image wrapper)."""
        return input_ids[:, -1:], mask[:, -1:]

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, h * (w + 1)] -> images [B, 3, 8h, 8w] in about [-1, 1] (Emu3's VQ decoder, one frame)."""
        return self.model.model.vqmodel.decode(self.codes(tokens))

    def codebook(self) -> torch.Tensor:
        """[C, d] code vectors as the quantizer compares them (plain L2); for LANTERN's neighbour table."""
        return self.model.model.vqmodel.quantize.embedding.weight.detach()
