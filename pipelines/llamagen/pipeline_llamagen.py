"""Text-to-image generation with a LlamaGen-architecture AR model: text encoder -> GPT over VQ tokens -> VQ decoder.

Structure and call conventions follow diffusers' pipelines (`GlmImagePipeline`, `AmusedPipeline`); decoding runs in
`mmspec.image` and is chosen per call with `decoding=` ("sjd" = speculative Jacobi decoding, the default; "ar" = plain
sampling with a KV cache; both draw from the same law).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import torch
from diffusers.image_processor import VaeImageProcessor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mmspec.core.component import DecodingComponent
from mmspec.models.heads import EagleHead, HydraHead
from mmspec.models.llamagen.adapter import LlamaGenAdapter, LlamaGenCondition
from mmspec.models.llamagen.captions import clean_caption
from mmspec.models.llamagen.gpt import LlamaGenTransformer
from mmspec.models.llamagen.graphs import WindowGraphs
from mmspec.models.llamagen.vq import LlamaGenVQModel
from mmspec.pipelines.ar_image import ARImagePipeline, size_error

logger = logging.getLogger(__name__)


def quoted(text: str, limit: int = 40) -> str:
    return repr(text[:limit] + "..." if len(text) > limit else text)


class LlamaGenPipeline(ARImagePipeline):
    r"""Text-to-image AR generation: prompt -> text states -> image tokens (GPT, classifier-free guidance) -> pixels.

    Components:
        transformer ([`LlamaGenTransformer`]): the t2i GPT over VQ codes.
        vqvae ([`LlamaGenVQModel`]): the VQ tokenizer whose decoder turns codes into pixels.
        tokenizer ([`PreTrainedTokenizerBase`]): the text encoder's tokenizer.
        text_encoder ([`PreTrainedModel`]): an encoder whose `last_hidden_state` [B, T, caption_dim] conditions the
            GPT (the embedded model uses a small T5 encoder; LlamaGen's FLAN-T5-XL plugs in the same way).
        draft_transformer ([`LlamaGenTransformer`], *optional*): a small t2i GPT over the same codes and text states,
            the drafter of `decoding="draft"`.
        eagle_head ([`EagleHead`], *optional*), hydra_head ([`HydraHead`], *optional*): draft heads on the
            transformer's own features, the drafters of `decoding="heads"` (`DraftHeads(kind=...)`), trained by
            `python -m mmspec.zoo.train_heads`.

    Called as every `ARImagePipeline` (see its `__call__`).

    Examples:
        ```py
        >>> import torch
        >>> from mmspec import LlamaGenPipeline

        >>> pipe = LlamaGenPipeline.from_pretrained("shapes")
        >>> out = pipe("two small red triangles above a blue circle on a striped background",
        ...            generator=torch.Generator().manual_seed(0))
        >>> out.images[0].save("shapes.png")
        >>> print(out.stats.table())
        ```
    """

    model_cpu_offload_seq = "text_encoder->transformer->vqvae"
    _optional_components = ["draft_transformer", "eagle_head", "hydra_head"]
    default_guidance_scale = 3.0
    default_top_k = 0
    checkpoint_files = "t2i_*.pt"

    transformer: LlamaGenTransformer
    vqvae: LlamaGenVQModel
    tokenizer: PreTrainedTokenizerBase
    text_encoder: PreTrainedModel
    draft_transformer: LlamaGenTransformer | None
    eagle_head: EagleHead | None
    hydra_head: HydraHead | None

    def __init__(self, transformer: LlamaGenTransformer, vqvae: LlamaGenVQModel, tokenizer: PreTrainedTokenizerBase,
                 text_encoder: PreTrainedModel, draft_transformer: LlamaGenTransformer | None = None,
                 eagle_head: EagleHead | None = None, hydra_head: HydraHead | None = None,
                 decoding: DecodingComponent | str | dict = "auto"):
        super().__init__()
        for name, model in (("transformer", transformer), ("draft_transformer", draft_transformer)):
            if model is not None and model.config.model_type != "t2i":
                raise ValueError(f"LlamaGenPipeline needs a t2i {name}, got model_type={model.config.model_type!r}")
        self.register_modules(transformer=transformer, vqvae=vqvae, tokenizer=tokenizer, text_encoder=text_encoder,
                              draft_transformer=draft_transformer, eagle_head=eagle_head, hydra_head=hydra_head)
        self.decoding = decoding
        self.window_graphs: dict[str, WindowGraphs] = {}  # `enable_cuda_graphs`
        self.image_processor = VaeImageProcessor(vae_scale_factor=vqvae.downsample_factor, do_normalize=True)

    @property
    def num_timesteps(self) -> int:
        return self.transformer.num_image_tokens

    @property
    def native_size(self) -> int:
        """The image side in pixels: the transformer's token grid times the VQ downsampling."""
        return self.transformer.config.grid_size * self.vqvae.downsample_factor

    @property
    def text_context(self) -> int:
        """Text tokens the transformer's condition prefix holds."""
        return self.transformer.config.cls_token_num

    def image_adapter(self, height: int | None = None, width: int | None = None) -> LlamaGenAdapter:
        size = self.native_size
        height, width = height or size, width or size
        if (height, width) != (size, size):
            raise size_error("this LlamaGen model", height, width, f"its token grid makes {size}x{size} only")
        self.replays_graphs()
        return LlamaGenAdapter(self.transformer, self.vqvae, self.window_graphs.get("transformer"))

    def draft_adapter(self) -> LlamaGenAdapter | None:
        if self.draft_transformer is None:
            return None
        return LlamaGenAdapter(self.draft_transformer, self.vqvae, self.window_graphs.get("draft_transformer"))

    def graph_stores(self, on: bool) -> None:
        """The decoding loop's graphs (`mmspec.models.llamagen.graphs.WindowGraphs`): each decoding's whole step —
        window forward, verification, redraft, commit, rollback — K iterations per graph, captured on a decoding's
        first call and replayed by later calls with the same settings and batch (on a GPU a small model's step is
        bound by kernel launches, and the host then reads the progress once per K iterations). The pipeline keeps its
        KV caches (one per transformer and setting, `WindowGraphs`) across calls, so one call runs at a time."""
        self.window_graphs = {name: WindowGraphs(model) for name, model in
                              (("transformer", self.transformer), ("draft_transformer", self.draft_transformer))
                              if model is not None} if on else {}

    @torch.no_grad()
    def encode_prompt(self, prompts: list[str], negative_prompt: list[str] | None = None,
                      adapter: LlamaGenAdapter | None = None) -> LlamaGenCondition:
        """Text states [B, T, caption_dim] left-padded to the transformer's T condition slots, with their mask.

        Each prompt is cleaned as LlamaGen cleans its captions (`clean_caption`: lower case, URLs, markup and
        punctuation runs removed, ...), and a prompt longer than T tokens is cut to its first T (the tokenizer's end
        token kept), with a warning naming what was cut, as LlamaGen's T5 embedder truncates."""
        if negative_prompt is not None:
            raise ValueError("LlamaGenPipeline takes no negative_prompt: its unconditional rows are the learned null "
                             "caption")
        captions = [clean_caption(p) for p in prompts]
        encoded = self.tokenizer(captions, padding="max_length", max_length=self.text_context, truncation=True,
                                 padding_side="left")
        self.warn_truncated(captions, encoded["input_ids"])
        input_ids, mask = torch.tensor(encoded["input_ids"]), torch.tensor(encoded["attention_mask"])
        for prompt, row in zip(prompts, mask, strict=True):
            if not row.any():
                raise ValueError(f"prompt {quoted(prompt)} has no words left once cleaned as LlamaGen cleans captions "
                                 "(URLs, markup, codes and punctuation runs are removed); say what to draw")
        unk = self.tokenizer.unk_token_id
        if unk is not None and (input_ids == unk).any():
            logger.warning("some prompt words are not in the text encoder's vocabulary and were read as %s",
                           self.tokenizer.unk_token)
        device = self._execution_device
        input_ids, mask = input_ids.to(device), mask.to(device)
        states = self.text_encoder(input_ids=input_ids, attention_mask=mask).last_hidden_state
        return LlamaGenCondition(states.to(self.transformer.dtype), mask.bool())

    def warn_truncated(self, captions: list[str], kept: list[list[int]]) -> None:
        """One warning per caption whose tokens did not all fit the text context (kept: the ids that went in)."""
        special = set(self.tokenizer.all_special_ids)
        full_ids = self.tokenizer(captions, verbose=False)["input_ids"]  # uncut: its own warning would repeat ours
        for caption, ids, full in zip(captions, kept, full_ids, strict=True):
            if len(full) > self.text_context:
                words = [i for i in full if i not in special]
                cut = self.tokenizer.decode(words[sum(i not in special for i in ids):])
                logger.warning("prompt %s is %d tokens long and the model's text context holds %d; this part was "
                               "cut: %r", quoted(caption), len(full), self.text_context, cut)

    @classmethod
    def from_llamagen_checkpoints(cls, gpt: str | Path, vq: str | Path, text_encoder: str | Path | PreTrainedModel,
                                  tokenizer: PreTrainedTokenizerBase | None = None, image_size: int = 512,
                                  dtype: torch.dtype | None = None, gpt_config: dict | None = None,
                                  vq_config: dict | None = None) -> LlamaGenPipeline:
        """The official t2i release: a GPT `.pt` (`t2i_XL_stage1_256.pt` with image_size=256, `t2i_XL_stage2_512.pt`
        with 512), the VQ `.pt` (`vq_ds16_t2i.pt`) and the text encoder — a FLAN-T5-XL directory (loaded with
        `T5EncoderModel` + `AutoTokenizer`) or any encoder module with its `tokenizer` (pluggable: whatever returns
        `last_hidden_state` [B, T, caption_dim]). `gpt_config` / `vq_config` override what the loaders infer."""
        from transformers import AutoTokenizer, T5EncoderModel

        transformer = LlamaGenTransformer.from_llamagen_checkpoint(gpt, image_size=image_size, **(gpt_config or {}))
        if transformer.config.model_type != "t2i":
            raise ValueError(f"{gpt} is a class-conditional (c2i) GPT; LlamaGenPipeline generates from text (t2i)")
        vqvae = LlamaGenVQModel.from_llamagen_checkpoint(vq, **(vq_config or {}))
        if isinstance(text_encoder, (str, Path)):
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(text_encoder)
            text_encoder = T5EncoderModel.from_pretrained(text_encoder)
        if tokenizer is None:
            raise ValueError("pass the tokenizer of a text_encoder given as a module")
        pipe = cls(transformer, vqvae, tokenizer, text_encoder.eval())
        return pipe if dtype is None else pipe.to(dtype=dtype)

    @classmethod
    def from_checkpoint_dir(cls, path: Path, image_size: int | None = None, **kwargs) -> LlamaGenPipeline:
        """A folder holding LlamaGen's t2i release as downloaded: one `t2i_*.pt` GPT, one `vq_*.pt` tokenizer and the
        T5 encoder folder (a subfolder with a t5 `config.json`); the image size is read from the GPT's name
        (`t2i_XL_stage2_512.pt` -> 512) unless given. `kwargs` go to `from_llamagen_checkpoints`."""
        def one(found: list[Path], what: str) -> Path:
            if len(found) != 1:
                raise ValueError(f"{path} must hold exactly one {what}, found {[p.name for p in found]}")
            return found[0]

        gpt = one(sorted(path.glob("t2i_*.pt")), "t2i GPT (t2i_*.pt)")
        vq = one(sorted(path.glob("vq_*.pt")), "VQ tokenizer (vq_*.pt)")
        t5 = one([d for d in sorted(path.iterdir()) if (d / "config.json").is_file()
                  and json.loads((d / "config.json").read_text()).get("model_type") == "t5"], "T5 encoder folder")
        if image_size is None:
            match = re.search(r"_(\d+)\.pt$", gpt.name)
            if match is None:
                raise ValueError(f"{gpt.name} does not name its image size; pass image_size=")
            image_size = int(match.group(1))
        return cls.from_llamagen_checkpoints(gpt, vq, t5, image_size=image_size, **kwargs)
