"""Random-weight models at the real configurations of the families the cost model measures (`mmspec.eval.cost_model`).

A forward's cost does not depend on the weights' values, so a model with random weights of a release's shapes costs
what the release costs. Each `RealShape` builds its target, a drafter (`DRAFT_LAYERS` decoder layers at the target's
width: an EAGLE / LANTERN drafter's size) and an EAGLE head at the target's width as `mmspec.image.DiscreteImageModel`
adapters (`Adapters`), and a condition for B samples; its VQ decoder is tiny, since a forward never touches it.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import torch

from mmspec.models.chameleon_vqgan import ChameleonVQGAN
from mmspec.models.emu3 import Emu3Adapter
from mmspec.models.heads import EagleHead
from mmspec.models.hf_image import PromptCondition, SlotGraphs, on_slot_cache
from mmspec.models.janus import JanusAdapter
from mmspec.models.llamagen.adapter import LlamaGenAdapter, LlamaGenCondition
from mmspec.models.llamagen.gpt import OFFICIAL_SIZES, LlamaGenTransformer
from mmspec.models.llamagen.graphs import WindowGraphs
from mmspec.models.llamagen.vq import LlamaGenVQModel
from mmspec.models.lumina_mgpt import (
    IMAGE_END,
    IMAGE_START,
    NEW_LINE,
    LuminaMGPTAdapter,
    LuminaMGPTForConditionalGeneration,
    grid_token,
)

DRAFT_LAYERS = 1
HEAD_SLACK = 64  # positions a 1-d EAGLE head holds past the prompt and the image (the widest window's)


@dataclass
class Adapters:
    """A target's adapters as its pipeline decodes with them: `target` (its steps captured where the pipeline captures
    them), the draft path's `drafter` (likewise), the target's `eager` adapter (its eager forwards' cost curve) and
    an EAGLE `head` on its features."""

    target: Any
    drafter: Any
    eager: Any
    head: torch.nn.Module


class RealShape:
    """A model at a real configuration, built with random weights: its target and drafter adapters
    (`mmspec.image.DiscreteImageModel`), an EAGLE head at its size and a condition for B samples. Subclasses set
    `layers`, `kv_width` (key or value features per token and layer) and `context` (tokens cached besides the image)
    and build the models."""

    layers: int
    kv_width: int
    context: int

    def model(self, layers: int | None = None) -> torch.nn.Module:
        raise NotImplementedError

    def adapter(self, model: torch.nn.Module):
        raise NotImplementedError

    def captured(self, model: torch.nn.Module, cuda: bool):
        """The adapter its pipeline captures the steps of: CUDA graphs (cuda), or their CPU tape."""
        raise NotImplementedError

    def head(self, model: torch.nn.Module, vocab_size: int) -> EagleHead:
        """An EAGLE head of one decoder layer at the target's width, attention heads and FFN width, random weights."""
        raise NotImplementedError

    def condition(self, batch_size: int, device: torch.device):
        raise NotImplementedError

    @property
    def image_tokens(self) -> int:
        raise NotImplementedError

    def parameters(self, layers: int | None = None) -> int:
        with torch.device("meta"):
            return sum(p.numel() for p in self.model(layers).parameters())

    def bytes_needed(self, dtype: torch.dtype, batch_size: int, window: int) -> int:
        """Weights (the target, the drafter and the head, counted at the drafter's size, which it is below) plus the
        KV cache of 2B rows over the context, the image and a window."""
        cache = 2 * self.layers * 2 * batch_size * (self.context + self.image_tokens + window) * self.kv_width
        return (self.parameters() + 2 * self.parameters(DRAFT_LAYERS) + cache) * dtype.itemsize

    def build(self, device: torch.device, dtype: torch.dtype, captured: bool) -> Adapters:
        """The target's, the drafter's (`DRAFT_LAYERS` decoder layers) and the head's adapters, random weights on
        `device`; captured: the target and the drafter with their steps captured (`captured`; CUDA graphs on a CUDA
        device), else eager."""
        with torch.device(device):
            target, drafter = self.model().to(dtype).eval(), self.model(DRAFT_LAYERS).to(dtype).eval()
        eager = self.adapter(target)
        # `type`, not diffusers' `to(dtype)`, which warns of float32-only modules a head has none of
        head = self.head(target, eager.vocab_size).to(device).type(dtype).eval()
        if not captured:
            return Adapters(eager, self.adapter(drafter), eager, head)
        cuda = device.type == "cuda"
        return Adapters(self.captured(target, cuda), self.captured(drafter, cuda), eager, head)


@dataclass(frozen=True)
class LlamaGenShape(RealShape):
    """A LlamaGen class-to-image GPT of an official size (`OFFICIAL_SIZES`) at an image size with the ds16 tokenizer."""

    size: str
    image_size: int
    context = 1  # the class token

    @property
    def config(self) -> dict:
        dim, layers, heads = OFFICIAL_SIZES[self.size]
        return {"dim": dim, "n_layer": layers, "n_head": heads, "grid_size": self.image_size // 16,
                "vocab_size": 16384, "model_type": "c2i"}

    @property
    def layers(self) -> int:
        return self.config["n_layer"]

    @property
    def kv_width(self) -> int:
        return self.config["dim"]

    @property
    def image_tokens(self) -> int:
        return self.config["grid_size"] ** 2

    def model(self, layers: int | None = None) -> LlamaGenTransformer:
        return LlamaGenTransformer(**{**self.config, "n_layer": layers or self.layers})

    def adapter(self, model: LlamaGenTransformer, graphs: WindowGraphs | None = None) -> LlamaGenAdapter:
        vq = LlamaGenVQModel(codebook_size=16384, ch=32, ch_mult=(1,), num_res_blocks=1, z_channels=32)
        return LlamaGenAdapter(model, vq.to(model.device), graphs)

    def captured(self, model: LlamaGenTransformer, cuda: bool) -> LlamaGenAdapter:
        return self.adapter(model, WindowGraphs(model, capture=cuda))

    def head(self, model: LlamaGenTransformer, vocab_size: int) -> EagleHead:
        block = model.layers[0]
        return EagleHead(feature_size=self.config["dim"], vocab_size=vocab_size, n_head=self.config["n_head"],
                         ffn_hidden=block.feed_forward.w1.out_features, positions="2d",
                         grid_size=self.config["grid_size"])

    def condition(self, batch_size: int, device: torch.device) -> LlamaGenCondition:
        return LlamaGenCondition(torch.zeros(batch_size, dtype=torch.long, device=device))


@dataclass(frozen=True)
class DecoderShape(RealShape):
    """A transformers family's Llama-style decoder at a release's size (width, FFN width, layers, attention heads),
    prompts of `context` tokens; `overrides`: configuration keywords merged over the release's (the tests build tiny
    ones)."""

    hidden: int
    intermediate: int
    num_layers: int
    heads: int
    _: KW_ONLY
    context: int = 32
    overrides: dict = field(default_factory=dict, compare=False)

    @property
    def layers(self) -> int:
        return self.num_layers

    def captured(self, model, cuda: bool):
        return on_slot_cache(self.adapter(model), SlotGraphs(cuda=cuda))

    def head(self, model, vocab_size: int) -> EagleHead:
        return EagleHead(feature_size=self.hidden, vocab_size=vocab_size, n_head=self.heads,
                         ffn_hidden=self.intermediate, max_positions=self.context + self.image_tokens + HEAD_SLACK)


@dataclass(frozen=True)
class JanusShape(DecoderShape):
    """Janus-Pro (transformers' `JanusForConditionalGeneration`), 384 px images (24 x 24 tokens of a 16,384-code VQ);
    `overrides` are JanusConfig keywords."""

    BOS, PAD, BOI = 100000, 100015, 100016  # Janus-Pro's ids of <begin_of_sentence>, <pad>, <begin_of_image>

    @property
    def kv_width(self) -> int:
        return self.hidden

    @property
    def image_tokens(self) -> int:
        vq = self.overrides.get("vq_config", {})
        return vq.get("num_patches", 24) ** 2

    def model(self, layers: int | None = None):
        from transformers import JanusConfig, JanusForConditionalGeneration

        text = {"model_type": "llama", "vocab_size": 102400, "hidden_size": self.hidden,
                "intermediate_size": self.intermediate, "num_attention_heads": self.heads,
                "num_key_value_heads": self.heads, "max_position_embeddings": 16384, "pad_token_id": self.PAD}
        vq = {"projection_dim": self.hidden, "image_token_embed_dim": self.hidden}
        config = {**self.overrides,
                  "text_config": {**text, **self.overrides.get("text_config", {}),
                                  "num_hidden_layers": layers or self.layers},
                  "vq_config": {**vq, **self.overrides.get("vq_config", {})}}
        model = JanusForConditionalGeneration(JanusConfig(**config))
        generation = model.generation_config
        generation.bos_token_id, generation.pad_token_id = self.BOS, self.PAD
        generation.generation_kwargs = {"boi_token_id": self.BOI}
        return model

    def adapter(self, model) -> JanusAdapter:
        return JanusAdapter(model)

    @classmethod
    def tiny(cls, patches: int) -> JanusShape:
        """A tiny Janus (width 32, 2 layers, a 12-code VQ) whose images are `patches` x `patches` tokens."""
        return cls(32, 37, 2, 4, context=6, overrides={
            "vision_config": {"image_size": 5 * patches, "patch_size": 5, "num_image_tokens": patches**2,
                              "hidden_size": 32, "projection_dim": 32, "num_hidden_layers": 1,
                              "num_attention_heads": 4, "mlp_ratio": 2},
            "vq_config": {"embed_dim": 12, "num_embeddings": 12, "latent_channels": 12, "base_channels": 32,
                          "channel_multiplier": [1, 1], "num_patches": patches},
            "text_config": {"vocab_size": 100020}, "image_token_id": 0})

    def condition(self, batch_size: int, device: torch.device) -> PromptCondition:
        ids = torch.full((batch_size, self.context), 5, dtype=torch.long, device=device)
        ids[:, 0], ids[:, -1] = self.BOS, self.BOI
        return PromptCondition(ids)


@dataclass(frozen=True)
class LineStructuredShape(DecoderShape):
    """A family that writes an image as text-vocabulary tokens, h rows of w codes each closed by a line token (Emu3,
    Lumina-mGPT; `mmspec.models.hf_image.LineStructuredAdapter`): besides the decoder's size its key-value heads and
    vocabulary, an image of `height` x `width` VQ tokens of a `codes`-code VQ (code tokens at the top of the
    vocabulary); prompts end with the family's image prefix. `overrides` are text-config keywords."""

    kv_heads: int
    vocab: int
    height: int
    width: int
    codes: int

    @property
    def kv_width(self) -> int:
        return self.hidden * self.kv_heads // self.heads

    @property
    def image_tokens(self) -> int:
        return self.height * (self.width + 1)

    def text_config(self, layers: int | None) -> dict:
        return {"vocab_size": self.vocab, "hidden_size": self.hidden, "intermediate_size": self.intermediate,
                "num_hidden_layers": layers or self.layers, "num_attention_heads": self.heads,
                "num_key_value_heads": self.kv_heads, "max_position_embeddings": self.context + self.image_tokens + 64,
                "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, **self.overrides}

    def code_tokens(self, name) -> dict[str, int]:
        """The vocabulary map's code tokens, name(code) -> id, at the top of the vocabulary."""
        return {name(code): self.vocab - self.codes + code for code in range(self.codes)}


@dataclass(frozen=True)
class Emu3Shape(LineStructuredShape):
    """Emu3-Gen (transformers' `Emu3ForConditionalGeneration`): 8 x 8-pixel codes of a 32,768-code VQ."""

    SPECIALS = ("<image>", "<|image start|>", "<|image token|>", "<|extra_200|>")  # the last: end of line

    def vocabulary(self) -> dict[str, int]:
        first = self.vocab - self.codes - len(self.SPECIALS)
        return {**{name: first + i for i, name in enumerate(self.SPECIALS)},
                **self.code_tokens(lambda code: f"<|visual token{code:06d}|>")}

    def model(self, layers: int | None = None):
        from transformers import Emu3Config, Emu3ForConditionalGeneration

        vq = {"codebook_size": self.codes, "embed_dim": 4, "latent_channels": 4, "temporal_downsample_factor": 1,
              "base_channels": 32, "channel_multiplier": [1], "hidden_size": 32, "attn_resolutions": []}
        return Emu3ForConditionalGeneration(Emu3Config(vq_config=vq, text_config=self.text_config(layers),
                                                       vocabulary_map=self.vocabulary()))

    def adapter(self, model) -> Emu3Adapter:
        return Emu3Adapter(model, self.height, self.width)

    def condition(self, batch_size: int, device: torch.device) -> PromptCondition:
        vocabulary = self.vocabulary()  # ... <|image start|> "h*w" <|image token|>
        ids = torch.full((batch_size, self.context), 5, dtype=torch.long, device=device)
        ids[:, 0], ids[:, -4], ids[:, -1] = 1, vocabulary["<|image start|>"], vocabulary["<|image token|>"]
        return PromptCondition(ids)


@dataclass(frozen=True)
class LuminaShape(LineStructuredShape):
    """Lumina-mGPT (a Chameleon decoder): 16 x 16-pixel codes of Chameleon's 8,192-code VQGAN, images of whole
    32-pixel patches (height and width even)."""

    def vocabulary(self) -> dict[str, int]:
        names = (IMAGE_START, IMAGE_END, NEW_LINE, grid_token(self.height // 2), grid_token(self.width // 2))
        first = self.vocab - self.codes - len(names)
        letters = str.maketrans("0123456789", "ABCDEFGHIJ")
        return {**{name: first + i for i, name in enumerate(dict.fromkeys(names))},
                **self.code_tokens(lambda code: f"IMGIMG{str(code).translate(letters)}Z")}

    def model(self, layers: int | None = None) -> LuminaMGPTForConditionalGeneration:
        from transformers import ChameleonConfig

        vq = {"embed_dim": 4, "num_embeddings": self.codes, "latent_channels": 4, "base_channels": 32,
              "channel_multiplier": [1]}
        return LuminaMGPTForConditionalGeneration(ChameleonConfig(**self.text_config(layers), vq_config=vq,
                                                                  vocabulary_map=self.vocabulary()))

    def adapter(self, model: LuminaMGPTForConditionalGeneration) -> LuminaMGPTAdapter:
        vqgan = ChameleonVQGAN(n_embed=self.codes, embed_dim=4, z_channels=32, ch=32, ch_mult=(1,), num_res_blocks=1,
                               resolution=16)
        return LuminaMGPTAdapter(model, vqgan.to(model.device), self.height, self.width)

    def condition(self, batch_size: int, device: torch.device) -> PromptCondition:
        vocabulary = self.vocabulary()
        ids = torch.full((batch_size, self.context), 5, dtype=torch.long, device=device)
        ids[:, 0] = 1
        ids[:, -3:] = torch.tensor([vocabulary[IMAGE_START], vocabulary[grid_token(self.height // 2)],
                                    vocabulary[grid_token(self.width // 2)]])
        return PromptCondition(ids)


REAL_SHAPES = {
    "llamagen-b": LlamaGenShape("GPT-B", 256),
    "llamagen-l": LlamaGenShape("GPT-L", 256),
    "llamagen-xl": LlamaGenShape("GPT-XL", 384),
    # the language models of deepseek-ai/Janus-Pro-1B and -7B (Llama: width, FFN width, layers, heads)
    "janus-pro-1b": JanusShape(2048, 5632, 24, 16),
    "janus-pro-7b": JanusShape(4096, 11008, 30, 32),
    # BAAI/Emu3-Gen: a Llama of 32 x 4096 (FFN 14,336, 8 key-value heads), vocabulary 184,622; 720 px = 90 x 90 codes
    "emu3-8b": Emu3Shape(4096, 14336, 32, 32, 8, 184622, 90, 90, 32768),
    # Alpha-VLLM/Lumina-mGPT-7B-768: Chameleon-7B (32 x 4096, FFN 11,008), vocabulary 65,536; 768 px = 48 x 48 codes
    "lumina-mgpt-7b": LuminaShape(4096, 11008, 32, 32, 32, 65536, 48, 48, 8192),
}
