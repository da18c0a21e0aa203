"""`CausalLMImageAdapter`: the `mmspec.image.DiscreteImageModel` protocol over a transformers decoder that writes images
as tokens after a text prompt (Janus, Emu3, Lumina-mGPT / Chameleon), on public modules only.

What the families share lives here, on the transformers implementation of the core's protocol
(`mmspec.adapters.CausalLMAdapter`): the conditional prompt rows and their unconditional (CFG) rows run as one batch on
its ragged cache, each left-padded to a common length with the padding invisible; windows of several image tokens per
forward; per-row rollback to prompt + kept tokens. What differs is a family's subclass: how image tokens enter the
model (`embed_image`), which logits are the image vocabulary (`image_logits`), and what the unconditional prompt is
(`unconditional`). CFG rows are returned unmixed; `mmspec.core.process_logits` combines them.

The adapter's token ids are local: 0..C-1 are the VQ codes (code index = token id), and a family whose image span holds
structure tokens (Emu3's end-of-line, Lumina-mGPT's new-line) puts them at ids >= C and exposes `forced_tokens`.

Shapes: B samples, T prompt tokens, W window, V local ids, N = h * w image-span tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mmspec.adapters.causal_lm import CausalLMAdapter, CausalLMState, cache_keyword
from mmspec.adapters.static_cache import StaticCausalLMAdapter
from mmspec.adapters.views import Readout
from mmspec.core.model import Logits


@dataclass(frozen=True)
class PromptCondition:
    """input_ids: [B, T] long, the image-generation prompts as the family's template builds them, left-padded;
    attention_mask: [B, T], 1 for real tokens (None = all real); negative_ids / negative_mask: [B, T'] the
    unconditional rows of CFG, left-padded (None = the family's default, see the adapter's `unconditional`)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None = None
    negative_ids: torch.Tensor | None = None
    negative_mask: torch.Tensor | None = None

    def __post_init__(self):
        for name in ("input_ids", "negative_ids"):
            ids = getattr(self, name)
            if ids is not None and (not isinstance(ids, torch.Tensor) or ids.ndim != 2 or ids.dtype != torch.long):
                raise TypeError(f"{name} must be a [B, T] long tensor, got {getattr(ids, 'shape', type(ids))}")
        if self.negative_ids is not None and self.negative_ids.shape[0] != self.input_ids.shape[0]:
            raise ValueError(f"negative_ids must have one row per prompt ({self.input_ids.shape[0]}), got "
                             f"{self.negative_ids.shape[0]}")


def mask_of(ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.to(ids.device).bool()


def left_pad(ids: torch.Tensor, mask: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids, mask [B, T] left-padded to [B, length] (pad id 0, invisible)."""
    pad = length - ids.shape[1]
    return torch.nn.functional.pad(ids, (pad, 0)), torch.nn.functional.pad(mask, (pad, 0))


class CausalLMImageAdapter(CausalLMAdapter):
    """Base of the transformers-family adapters. A subclass sets `model`, `language_model` (the decoder returning
    `last_hidden_state`), `grid`, `vocab_size` and implements `embed_image`, `image_logits`, `unconditional`,
    `decode`, `codebook`. The "features" capability reads the image tokens through the family's own embedding and
    image head (`feature_readout`), so a draft head works on every family; "tree" scores a frontier tree's nodes in
    one forward with tree attention (`CausalLMAdapter.forward_tree`)."""

    capabilities = frozenset({"tree", "features"})
    model: torch.nn.Module
    language_model: torch.nn.Module
    grid: tuple[int, int]
    vocab_size: int

    def embed_image(self, tokens: torch.Tensor) -> torch.Tensor:
        """Local image-span ids [R, W] -> input embeddings [R, W, D]."""
        raise NotImplementedError

    def image_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Last hidden states [R, W, D] -> float32 logits over the local ids [R, W, V]."""
        raise NotImplementedError

    def unconditional(self, input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The family's default unconditional rows (ids, mask) of prompts [B, T] (used when the condition has no
        negative_ids)."""
        raise NotImplementedError

    @property
    def backbone(self) -> torch.nn.Module:
        return self.language_model

    def prompt_inputs(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"inputs_embeds": self.model.get_input_embeddings()(input_ids)}

    def token_inputs(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"inputs_embeds": self.embed_image(tokens)}

    def head(self, output) -> torch.Tensor:
        return self.feature_readout()[1](output.last_hidden_state)

    def head_at(self, output, index: torch.Tensor) -> torch.Tensor:
        hidden = output.last_hidden_state
        return self.feature_readout()[1](hidden.gather(1, index[:, None, None].expand(-1, 1, hidden.shape[-1])))

    def feature_readout(self) -> tuple[Readout, Readout]:
        """The embedding of the local image ids (`embed_image`) and their logits (`image_logits`) as modules, made
        once: every forward's logits go through the second, so a feature tap on it catches the language model's last
        hidden states."""
        if "_readout" not in vars(self):
            self._readout = (Readout(self.embed_image, self.language_model),
                             Readout(self.image_logits, self.language_model))
        return self._readout

    def feature_layers(self) -> list[torch.nn.Module]:
        """The language model's decoder layers in order."""
        return list(self.language_model.layers)

    def prefill(self, condition: PromptCondition, cfg: bool,
                max_window: int = 1) -> tuple[CausalLMState, Logits]:
        ids = condition.input_ids
        mask = mask_of(ids, condition.attention_mask)
        if cfg:
            if condition.negative_ids is None:
                negative, negative_mask = self.unconditional(ids, mask)
            else:
                negative, negative_mask = condition.negative_ids, mask_of(condition.negative_ids,
                                                                           condition.negative_mask)
            length = max(ids.shape[1], negative.shape[1])
            (ids, mask), (negative, negative_mask) = left_pad(ids, mask, length), left_pad(negative, negative_mask,
                                                                                           length)
            ids, mask = torch.cat([ids, negative]), torch.cat([mask, negative_mask])
        return self.prefill_rows(ids, mask, condition.input_ids.shape[0], cfg)


def structured_span(height: int, width: int, line_token: int) -> torch.Tensor:
    """forced_tokens [height * (width + 1)] of an image span written row by row, each row closed by `line_token`:
    -1 (free) on image columns, `line_token` on the last column."""
    forced = torch.full((height, width + 1), -1, dtype=torch.long)
    forced[:, width] = line_token
    return forced.flatten()


class LineStructuredAdapter(CausalLMImageAdapter):
    """Base of the families that write an image as text-vocabulary tokens through the LM head (Emu3, Lumina-mGPT):
    `height` rows of `width` codes, each row closed by a line token. Local ids 0..C-1 are the codes, id C
    (`line_token`) the line token, forced on the last column of the span (h, w + 1); `token_ids` [V] maps local ids
    to the model's vocabulary. A subclass calls `set_span` and implements `unconditional` and `decode` (of `codes`)."""

    def set_span(self, height: int, width: int, code_ids: list[int], line_id: int) -> None:
        """code_ids: the vocabulary id of each code 0..C-1; line_id: the vocabulary id of the line token."""
        device = self.model.lm_head.weight.device
        self.height, self.width, self.n_codes = height, width, len(code_ids)
        self.grid = (height, width + 1)
        self.vocab_size = self.n_codes + 1
        self.line_token = self.n_codes
        self.forced_tokens = structured_span(height, width, self.line_token).to(device)
        self.token_ids = torch.tensor(code_ids + [line_id], device=device)  # [V]
        self.codebook_token_ids = torch.arange(self.n_codes)

    def embed_image(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(self.token_ids[tokens])

    def image_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head's logits at the local ids, float32: the codes as they are, the line token at the float32
        minimum — it is only ever emitted where `forced_tokens` names it, and a finite minimum keeps CFG's difference
        of logits finite. Only the head's rows of the local ids are scored (`image_head`): the law over the rest of
        the vocabulary is zero in the image span, so scoring them (most of a family's head) would change nothing."""
        local = F.linear(hidden, *self.image_head()).float()
        local[..., self.line_token] = torch.finfo(torch.float32).min
        return local

    def image_head(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight [V, D], bias [V] or None): the LM head's rows of the local ids (`token_ids`), gathered on first
        use and again when the head's weight is replaced or moves (another device or dtype). The check reads no data
        pointer, so a traced step holds it."""
        weight = self.model.lm_head.weight
        key = getattr(self, "_image_head_key", None)
        if key is None or key[0] is not weight or key[1] != weight.dtype or key[2] != weight.device:
            bias = self.model.lm_head.bias
            ids = self.token_ids.to(weight.device)
            self._image_head = weight[ids], None if bias is None else bias[ids]
            self._image_head_key = weight, weight.dtype, weight.device
        return self._image_head

    def to_bpe(self, tokens: torch.Tensor) -> torch.Tensor:
        """Local ids [B, N] -> the vocabulary (BPE) ids the family's own loop writes for the same image span."""
        return self.token_ids[tokens]

    def codes(self, tokens: torch.Tensor) -> torch.Tensor:
        """The codes [B, h, w] of image-span tokens [B, h * (w + 1)] (line column dropped)."""
        return tokens.view(-1, self.height, self.width + 1)[..., : self.width]


SLOT_ROUNDING = 64  # a cache's slots are rounded up to this, so that prompts of similar lengths share captured steps


class SlotGraphs:
    """The captured decoding steps of one family model (`mmspec.core.runtime.capture.StepGraphs`: CUDA graphs, or
    with cuda=False their CPU tape, which replays with a CUDA graph's semantics), kept across calls by the pipeline;
    `mmspec.image.loop` finds them as `adapter.graphs.steps`."""

    capture_static = True  # kept across decodings: not a step's state

    def __init__(self, cuda: bool = True):
        from mmspec.core.runtime.capture import StepGraphs

        self.steps = StepGraphs(cuda=cuda)


class SlotCacheFamily(StaticCausalLMAdapter):
    """A family adapter on a `SlotCache` of fixed capacity (`StaticCausalLMAdapter`: writes by slot index, rollback
    by length, no host read), made by `on_slot_cache`: the family's own inputs, language model and image head, with
    each decoding's capacity its prompt (CFG rows laid out), the image span and the widest window, rounded up to
    `SLOT_ROUNDING`."""

    capture_static = True  # its weights and graphs, not a decoding's state (which lives in the state it returns)
    graphs: SlotGraphs | None
    max_window: int = 1

    def prefill(self, condition: PromptCondition, cfg: bool, max_window: int = 1):
        self.max_window = max_window
        return super().prefill(condition, cfg, max_window)

    def prefill_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, batch_size: int, cfg: bool):
        N = self.grid[0] * self.grid[1]
        self.capacity = -(-(input_ids.shape[1] + N + self.max_window + 1) // SLOT_ROUNDING) * SLOT_ROUNDING
        return super().prefill_rows(input_ids, attention_mask, batch_size, cfg)


def on_slot_cache(adapter: CausalLMImageAdapter, graphs: SlotGraphs | None) -> CausalLMImageAdapter:
    """The family `adapter` (Janus, Emu3, Lumina-mGPT, ...) decoding on a fixed-capacity slot cache, its decoding
    steps captured whole in `graphs` (keep one `SlotGraphs` per model across calls, so that later calls replay what
    the first captured; None: the steps run eagerly on the slot cache): what the family pipelines run on CUDA. Same
    tokens as the adapter's eager path, which stays for CPUs and for checks."""
    family = type(adapter)
    static = type(f"SlotCache{family.__name__}", (SlotCacheFamily, family), {})
    made = object.__new__(static)
    made.__dict__.update(vars(adapter))
    made.cache_keyword = cache_keyword(adapter.backbone)
    made.capacity, made.graphs = 1, graphs
    return made
