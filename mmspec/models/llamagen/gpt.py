"""LlamaGen's GPT (Sun et al., arXiv 2406.06525, §2.3) as a diffusers `ModelMixin, ConfigMixin`, with a static KV cache
that takes multi-token windows and rolls back per row.

Architecture as in LlamaGen's `autoregressive/models/gpt.py` (itself from gpt-fast / Llama): pre-norm Llama blocks
(RMSNorm, fused QKV, SwiGLU), 2-D RoPE over the image grid, and a condition prefix: one class token for c2i, or
`cls_token_num` projected text-encoder states for t2i (with a learned unconditional sequence for classifier-free
guidance). As in the official model, the condition positions get a zero RoPE table (their queries and keys are zero
after rotation); the official checkpoints were trained so, and it is kept. Parameter names are the official ones, so
`from_llamagen_checkpoint` loads `c2i_{B,L,XL}_*.pt` and `t2i_*.pt` without renaming.

Sequence layout: slots 0..T-1 hold the condition (T = cls_token_num), slot T + i holds image token i; the logits read at
slot T - 1 + i predict image token i. Shapes: B batch rows, T condition slots, N = grid_size**2 image tokens, W window,
S cache slots, V codebook size, H heads, D head dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn

from mmspec.models.checkpoint import load_official_state_dict, load_weights

# what LlamaGen's sampling scripts read, in their order; a training run's EMA copy ("ema") is an option
SAMPLING_KEYS = ("model", "module", "state_dict")

# what LlamaGen's sampling scripts read, in their order; a training run's EMA copy ("ema") is an option
SAMPLING_KEYS = ("model", "module", "state_dict")

MODEL_TYPES = ("c2i", "t2i")
# Which caption slots the unconditional (null-caption) rows of a t2i model attend to: "prompt" = the slots the
# prompt's own padding mask keeps (LlamaGen's training and `generate()`: a dropped caption keeps its mask), "all" =
# every slot of the null caption (how the embedded zoo model was trained). A model keeps the convention it was
# trained with; its config says which.
NULL_CAPTION_MASKS = ("prompt", "all")
# Entries of released GPT files that are not weights: the static KV cache of a model saved after sampling.
KNOWN_EXTRAS = ("layers.*.attention.kv_cache.*",)
# Official sizes (autoregressive/models/gpt.py `GPT_models`): width -> (layers, heads). Widths are unique, so a
# checkpoint's width names its size.
OFFICIAL_SIZES = {
    "GPT-B": (768, 12, 12), "GPT-L": (1024, 24, 16), "GPT-XL": (1280, 36, 20), "GPT-XXL": (1536, 48, 24),
    "GPT-XXXL": (2560, 48, 40), "GPT-1B": (2048, 22, 32), "GPT-3B": (3200, 24, 32), "GPT-7B": (4096, 32, 32),
}


def _find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - n % k


def rope_table_2d(grid_size: int, head_dim: int, base: float, cls_token_num: int) -> torch.Tensor:
    """[cls_token_num + grid_size**2, head_dim // 2, 2] (cos, sin) table; half of each head rotates with the row index,
    half with the column index; the condition prefix gets zeros (as the official model)."""
    half = head_dim // 2
    freqs = 1.0 / (base ** (torch.arange(0, half, 2)[: half // 2].float() / half))  # [head_dim // 4]
    angles = torch.outer(torch.arange(grid_size, dtype=torch.float32), freqs)  # [G, head_dim // 4]
    grid = torch.cat(
        [angles[:, None, :].expand(-1, grid_size, -1), angles[None, :, :].expand(grid_size, -1, -1)], dim=-1
    )  # [G, G, head_dim // 2]: (row angles, column angles)
    table = torch.stack([grid.cos(), grid.sin()], dim=-1).flatten(0, 1)  # [G*G, head_dim // 2, 2]
    return torch.cat([torch.zeros(cls_token_num, half, 2), table])


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """x: [B, W, H, D]; table: [B, W, D // 2, 2] -> x rotated pairwise, in x's dtype (computed in float32)."""
    pairs = x.float().unflatten(-1, (-1, 2))  # [B, W, H, D/2, 2]
    cos, sin = table[:, :, None, :, 0], table[:, :, None, :, 1]
    rotated = torch.stack([pairs[..., 0] * cos - pairs[..., 1] * sin, pairs[..., 1] * cos + pairs[..., 0] * sin], -1)
    return rotated.flatten(-2).type_as(x)


@dataclass
class KVCache:
    """Static per-layer key/value buffers, written by slot index (gpt-fast style), with per-row fill levels.

    k, v: [n_layer, R, H_kv, S, D]; key_valid: [R, S] bool, False for padded condition slots; lengths: [R] long, the
    number of filled slots per row. Rolling a row back only lowers its length: stale slots beyond it are masked out
    and overwritten by the next window, so speculate-then-rollback leaves exactly the cache of never speculating.
    """

    k: torch.Tensor
    v: torch.Tensor
    key_valid: torch.Tensor
    lengths: torch.Tensor
    max_length: int = 0  # host-side upper bound on `lengths`, so overflow checks need no device sync

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def copy_slots(self, target: torch.Tensor, source: torch.Tensor) -> None:
        """Copy every layer's key/value of slot source[r, t] onto slot target[r, t] of row r (target, source: [R, T]
        long; the targets of a row distinct)."""
        rows = torch.arange(target.shape[0], device=target.device)[:, None]
        self.k[:, rows, :, target] = self.k[:, rows, :, source]
        self.v[:, rows, :, target] = self.v[:, rows, :, source]

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the rows `rows` ([R'] long), in that order."""
        self.k, self.v = self.k[:, rows], self.v[:, rows]
        self.key_valid, self.lengths = self.key_valid[rows], self.lengths[rows]

    def rollback(self, lengths: torch.Tensor, bound: int | None = None) -> None:
        """Keep the first `lengths[r]` slots of row r (lengths: [R] long, each <= the current fill level). bound: a
        host-side upper bound on `lengths` the caller guarantees (a decoding knows how far its rows can be); without
        it the fill levels are read (a host sync)."""
        if lengths.shape != self.lengths.shape:
            raise ValueError(f"lengths must have shape {tuple(self.lengths.shape)}, got {tuple(lengths.shape)}")
        self.lengths.copy_(lengths)  # in place: a captured window forward (`WindowGraphs`) reads this tensor
        self.max_length = int(lengths.max()) if bound is None else min(self.max_length, bound)


def check_window_fits(cache: KVCache, width: int) -> None:
    """Raise if a window of `width` after the fullest row would overflow the cache (host-side: no device sync)."""
    if cache.max_length + width > cache.capacity:
        raise ValueError(
            f"a window of {width} after up to {cache.max_length} filled slots overflows the cache "
            f"({cache.capacity} slots)"
        )


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.ffn_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ffn_dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


class Attention(nn.Module):
    def __init__(self, dim: int, n_head: int, n_kv_head: int, dropout: float):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, dim // n_head
        self.wqkv = nn.Linear(dim, (n_head + 2 * n_kv_head) * self.head_dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        rope: torch.Tensor,
        mask: torch.Tensor,
        cache: tuple[torch.Tensor, torch.Tensor] | None = None,
        slots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: [B, W, dim]; rope: [B, W, D/2, 2]; mask: [B, 1, W, S] bool (True = attend).
        With `cache` = (k [B, H_kv, S, D], v) the window's keys/values are written at `slots` [B, W] first and the
        queries attend over the whole buffer; without it S = W."""
        B, W, _ = x.shape
        kv_size = self.n_kv_head * self.head_dim
        q, k, v = self.wqkv(x).split([self.n_head * self.head_dim, kv_size, kv_size], dim=-1)
        q = apply_rope(q.view(B, W, self.n_head, self.head_dim), rope)
        k = apply_rope(k.view(B, W, self.n_kv_head, self.head_dim), rope)
        v = v.view(B, W, self.n_kv_head, self.head_dim)
        if cache is not None:
            rows = torch.arange(B, device=x.device)[:, None]
            cache[0][rows, :, slots] = k  # advanced indices [B, W] around a slice: value layout [B, W, H_kv, D]
            cache[1][rows, :, slots] = v
            k, v = cache
        else:
            k, v = k.transpose(1, 2), v.transpose(1, 2)  # [B, H_kv, W, D]
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k, v, attn_mask=mask, enable_gqa=self.n_kv_head != self.n_head
        )  # [B, H, W, D]
        return self.resid_dropout(self.wo(out.transpose(1, 2).reshape(B, W, -1)))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, n_head: int, n_kv_head: int, ffn_hidden: int, norm_eps: float, resid_dropout: float,
                 ffn_dropout: float):
        super().__init__()
        self.attention = Attention(dim, n_head, n_kv_head, resid_dropout)
        self.feed_forward = FeedForward(dim, ffn_hidden, ffn_dropout)
        self.attention_norm = RMSNorm(dim, norm_eps)
        self.ffn_norm = RMSNorm(dim, norm_eps)

    def forward(self, x, rope, mask, cache=None, slots=None):
        h = x + self.attention(self.attention_norm(x), rope, mask, cache, slots)
        return h + self.feed_forward(self.ffn_norm(h))


class LabelEmbedder(nn.Module):
    """c2i condition: one learned token per class; row `num_classes` is the unconditional (null) class."""

    def __init__(self, num_classes: int, dim: int):
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + 1, dim)


class MLP(nn.Module):
    def __init__(self, in_features: int, hidden: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden, bias=False)
        self.fc2 = nn.Linear(hidden, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class CaptionEmbedder(nn.Module):
    """t2i condition: text-encoder states [B, T, caption_dim] through a 2-layer MLP; `uncond_embedding` is the learned
    caption used for unconditional rows."""

    def __init__(self, caption_dim: int, dim: int, token_num: int):
        super().__init__()
        self.cap_proj = MLP(caption_dim, dim, dim)
        self.uncond_embedding = nn.Parameter(torch.randn(token_num, caption_dim) / caption_dim**0.5)


class LlamaGenTransformer(ModelMixin, ConfigMixin):
    """LlamaGen GPT for class- (c2i) or text-conditional (t2i) image-token generation.

    Defaults are the official GPT-B c2i model for 256px images with the ds16 tokenizer (16x16 = 256 tokens).
    `null_caption_mask` (t2i): which caption slots the unconditional rows see, "prompt" (the prompt's own padding
    mask, as LlamaGen trains and samples) or "all" (see `NULL_CAPTION_MASKS`).
    """

    @register_to_config
    def __init__(
        self,
        vocab_size: int = 16384,
        dim: int = 768,
        n_layer: int = 12,
        n_head: int = 12,
        n_kv_head: int | None = None,
        multiple_of: int = 256,
        ffn_dim_multiplier: float | None = None,
        rope_base: float = 10000.0,
        norm_eps: float = 1e-5,
        initializer_range: float = 0.02,
        model_type: str = "c2i",
        num_classes: int = 1000,
        caption_dim: int = 2048,
        cls_token_num: int = 1,
        grid_size: int = 16,
        class_dropout_prob: float = 0.1,
        token_dropout_p: float = 0.1,
        resid_dropout_p: float = 0.1,
        ffn_dropout_p: float = 0.1,
        null_caption_mask: str = "prompt",
    ):
        super().__init__()
        if model_type not in MODEL_TYPES:
            raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")
        if null_caption_mask not in NULL_CAPTION_MASKS:
            raise ValueError(f"null_caption_mask must be one of {NULL_CAPTION_MASKS}, got {null_caption_mask!r}")
        if dim % n_head or (dim // n_head) % 4:
            raise ValueError(f"dim / n_head must be a multiple of 4 (2-D RoPE), got dim={dim}, n_head={n_head}")
        if model_type == "c2i" and cls_token_num != 1:
            raise ValueError(f"a c2i model has one class token, got cls_token_num={cls_token_num}")
        n_kv_head = n_kv_head or n_head
        ffn_hidden = int(2 * 4 * dim / 3)
        if ffn_dim_multiplier is not None:
            ffn_hidden = int(ffn_dim_multiplier * ffn_hidden)
        ffn_hidden = _find_multiple(ffn_hidden, multiple_of)

        if model_type == "c2i":
            self.cls_embedding = LabelEmbedder(num_classes, dim)
        else:
            self.cls_embedding = CaptionEmbedder(caption_dim, dim, cls_token_num)
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.tok_dropout = nn.Dropout(token_dropout_p)
        self.layers = nn.ModuleList(
            TransformerBlock(dim, n_head, n_kv_head, ffn_hidden, norm_eps, resid_dropout_p, ffn_dropout_p)
            for _ in range(n_layer)
        )
        self.norm = RMSNorm(dim, norm_eps)
        self.output = nn.Linear(dim, vocab_size, bias=False)
        self.register_buffer(
            "rope", rope_table_2d(grid_size, dim // n_head, rope_base, cls_token_num), persistent=False
        )
        self.apply(self._init_weights)
        nn.init.zeros_(self.output.weight)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.config.initializer_range)

    @property
    def num_image_tokens(self) -> int:
        return self.config.grid_size**2

    # ---- condition -------------------------------------------------------------------------------------------------
    def embed_condition(self, condition: torch.Tensor, drop: torch.Tensor | None = None) -> torch.Tensor:
        """Condition prefix [B, T, dim].

        condition: c2i: class labels [B] long (`num_classes` = unconditional); t2i: text-encoder states
        [B, T, caption_dim], left-padded (valid tokens last, as LlamaGen lays out its T5 states).
        drop: [B] bool, rows replaced by the unconditional condition (CFG training and unconditional rows).
        """
        if self.config.model_type == "c2i":
            if condition.ndim != 1 or condition.dtype != torch.long:
                raise ValueError(
                    f"c2i condition must be class labels [B] long, got {tuple(condition.shape)} {condition.dtype}"
                )
            labels = condition if drop is None else condition.masked_fill(drop, self.config.num_classes)
            return self.cls_embedding.embedding_table(labels)[:, None]
        T = self.config.cls_token_num
        if condition.ndim != 3 or condition.shape[1:] != (T, self.config.caption_dim):
            raise ValueError(
                f"t2i condition must be text states [B, {T}, {self.config.caption_dim}], got {tuple(condition.shape)}"
            )
        if drop is not None:
            uncond = self.cls_embedding.uncond_embedding.to(condition.dtype)
            condition = torch.where(drop[:, None, None], uncond, condition)
        return self.cls_embedding.cap_proj(condition)

    def unconditional(self, batch_size: int, device: torch.device) -> torch.Tensor:
        """The unconditional condition for `batch_size` rows (null labels, or the learned uncond caption)."""
        if self.config.model_type == "c2i":
            return torch.full((batch_size,), self.config.num_classes, dtype=torch.long, device=device)
        return self.cls_embedding.uncond_embedding[None].expand(batch_size, -1, -1)

    def unconditional_mask(self, condition_mask: torch.Tensor | None) -> torch.Tensor | None:
        """The caption mask [B, T] bool of the unconditional twins of samples whose captions have `condition_mask`
        [B, T] (None = all real): the prompt's own under `null_caption_mask="prompt"`, None (every slot) under
        "all"."""
        return condition_mask if self.config.null_caption_mask == "prompt" else None

    # ---- full-sequence pass (training, reference) -------------------------------------------------------------------
    def forward(
        self,
        tokens: torch.Tensor,
        condition: torch.Tensor,
        condition_mask: torch.Tensor | None = None,
        drop: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher-forced logits for every image token: tokens [B, N'] (N' <= N), condition as in `embed_condition`,
        condition_mask [B, T] bool (True = real token; None = all real); drop [B] bool, rows whose caption is replaced
        by the null caption, which then sees the slots `null_caption_mask` says. Returns logits [B, N', V] float32,
        row i predicting tokens[:, i] from the condition and tokens[:, :i]."""
        B, n = tokens.shape
        T = self.config.cls_token_num
        if n > self.num_image_tokens:
            raise ValueError(f"tokens has {n} positions but the grid holds {self.num_image_tokens}")
        x = torch.cat([self.embed_condition(condition, drop), self.tok_embeddings(tokens[:, :-1])], dim=1)
        x = self.tok_dropout(x)  # [B, T + n - 1, dim]
        S = x.shape[1]
        key_valid = torch.ones(B, S, dtype=torch.bool, device=x.device)
        if condition_mask is not None:
            dropped_see_all = drop is not None and self.config.null_caption_mask == "all"
            key_valid[:, :T] = condition_mask | drop[:, None] if dropped_see_all else condition_mask
        slots = torch.arange(S, device=x.device).expand(B, S)
        h = self._blocks(x, slots, self._mask(slots, key_valid), None)
        return self.output(self.norm(h[:, T - 1 :])).float()

    # ---- cached windows (inference) ---------------------------------------------------------------------------------
    @property
    def scratch_start(self) -> int:
        """The first cache slot past the condition prefix and the image: windows that overhang the image and parallel
        segment inputs go there."""
        return self.config.cls_token_num + self.num_image_tokens

    def new_cache(self, rows: int, device=None, dtype=None, extra_slots: int = 0) -> KVCache:
        """An empty cache for `rows` sequences: one slot per condition position and image token, plus `extra_slots`
        past the image for speculative windows of rows that are ahead of others (their contents are never read by a
        committed token)."""
        c = self.config
        slots = self.scratch_start + extra_slots
        shape = (c.n_layer, rows, c.n_kv_head or c.n_head, slots, c.dim // c.n_head)
        device, dtype = device or self.device, dtype or self.dtype
        return KVCache(
            k=torch.zeros(shape, device=device, dtype=dtype),
            v=torch.zeros(shape, device=device, dtype=dtype),
            key_valid=torch.ones(rows, shape[3], dtype=torch.bool, device=device),
            lengths=torch.zeros(rows, dtype=torch.long, device=device),
        )

    def forward_window(self, x: torch.Tensor, cache: KVCache, tree: tuple[torch.Tensor, torch.Tensor] | None = None
                       ) -> torch.Tensor:
        """Append a window of W embedded inputs per row at each row's fill level and return their logits.

        x: [R, W, dim] (condition embeddings or `tok_embeddings(tokens)`); cache: R rows. Returns logits [R, W, V]
        float32; row r's window occupies slots lengths[r] .. lengths[r] + W - 1, after which lengths[r] += W.
        tree: (offset, visible) for a window of tree nodes appended after P nodes of the same tree (those of the
        previous calls since the tree began, P >= 0): offset [W] or [R, W] long, node t sits at position
        start[r] + offset[t] where start = lengths - P is the tree's first slot; visible [W, P + W] or [R, W, P + W]
        bool, the tree's nodes (earlier calls' first) that node t sees besides the cached prefix before the tree
        (its ancestors and itself: tree attention); None = a chain.
        """
        W = x.shape[1]
        check_window_fits(cache, W)
        logits = self.append_window(x, cache, tree)
        cache.max_length += W
        return logits

    def append_window(self, x: torch.Tensor, cache: KVCache, tree: tuple[torch.Tensor, torch.Tensor] | None = None
                      ) -> torch.Tensor:
        """`forward_window`'s device work alone (no capacity check, `cache.max_length` not moved): no host sync and
        no Python state, so that a CUDA graph can capture it (`mmspec.models.llamagen.graphs.WindowGraphs`)."""
        W = x.shape[1]
        slots = cache.lengths[:, None] + torch.arange(W, device=x.device)  # [R, W]
        mask = self._mask(slots, cache.key_valid, cache.capacity, None if tree is None else tree[1])
        positions = slots if tree is None else cache.lengths[:, None] - (tree[1].shape[-1] - W) + tree[0]
        h = self._blocks(x, slots, mask, cache, positions)
        cache.lengths += W
        return self.output(self.norm(h)).float()

    def forward_segments(self, x: torch.Tensor, cache: KVCache, positions: torch.Tensor, segments: torch.Tensor,
                         cached: torch.Tensor) -> torch.Tensor:
        """Score T inputs per row that sit at scattered positions, under a segment-causal mask (parallel row windows).

        x: [R, T, dim] embedded inputs; positions: [R, T] the slot each input belongs to (condition length + image
        position; rotary position too); segments: [R, T] long, inputs of one segment are consecutive; cached: [R, S]
        bool, the slots holding keys/values a query may read. Input t sees the cached slots before its own position
        and the inputs of its segment up to itself. The inputs' keys/values go to the scratch slots past the image
        (base .. base + T - 1, base = condition length + N), where `commit_segments` of the adapter copies them from.
        Returns logits [R, T, V] float32; the fill levels are not moved."""
        R, T = segments.shape
        base = self.scratch_start
        if base + T > cache.capacity:
            raise ValueError(f"{T} segment inputs overflow the cache's {cache.capacity - base} scratch slots")
        index = torch.arange(T, device=x.device)
        slots = (base + index).expand(R, T)
        keys = torch.arange(cache.capacity, device=x.device)
        scratch = (keys >= base) & (keys < base + T)  # [S]
        own = (segments[:, None, :] == segments[:, :, None]) & (index[None, :] <= index[:, None])  # [R, T, T]
        own = scratch & own.gather(2, (keys - base).clamp(0, T - 1).expand(R, T, -1))  # [R, T, S]
        before = ~scratch & cached[:, None, :] & (keys < positions[..., None])
        h = self._blocks(x, slots, (own | before)[:, None], cache, positions)
        return self.output(self.norm(h)).float()

    def _mask(self, slots: torch.Tensor, key_valid: torch.Tensor, capacity: int | None = None,
              visible: torch.Tensor | None = None) -> torch.Tensor:
        """[R, 1, W, S] bool: a query at slot s sees valid keys at slots <= s, and always itself (so that a padded
        condition slot, which sees nothing else, still has a finite output). With `visible` ([W, P + W] or
        [R, W, P + W], `forward_window`'s tree) the keys of the tree's P + W slots that end with the window are seen
        only where visible says."""
        keys = torch.arange(capacity or slots.shape[1], device=slots.device)
        causal = keys[None, None, :] <= slots[:, :, None]  # [R, W, S]
        if visible is not None:
            (R, W), span = slots.shape, visible.shape[-1]
            node = keys[None, :] - (slots[:, :1] + W - span)  # [R, S], a key's node index in the tree
            in_tree = (node >= 0) & (node < span)
            seen = visible.expand(R, W, span).gather(2, node.clamp(0, span - 1)[:, None, :].expand(R, W, -1))
            causal = torch.where(in_tree[:, None, :], seen, causal)
        return ((causal & key_valid[:, None, :]) | (keys[None, None, :] == slots[:, :, None]))[:, None]

    def _blocks(self, x: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor, cache: KVCache | None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """positions: [R, W] rotary positions (None = the slots); past the image they are scratch (clamped)."""
        positions = slots if positions is None else positions
        rope = self.rope[positions.clamp(max=self.rope.shape[0] - 1)]  # [R, W, D/2, 2]
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, mask, None if cache is None else (cache.k[i], cache.v[i]), slots)
        return x

    # ---- official checkpoints ---------------------------------------------------------------------------------------
    @classmethod
    def from_llamagen_checkpoint(cls, path: str | Path, image_size: int = 256, downsample: int = 16,
                                 weights: str | None = None, **config) -> LlamaGenTransformer:
        """Load an official LlamaGen GPT `.pt` file (`c2i_B_256.pt`, `c2i_L_384.pt`, `c2i_XL_384.pt`, `t2i_XL_*.pt`).

        Width, depth, vocabulary, class count / caption width and prefix length are read from the weights; the head
        count follows from the width (official sizes); `image_size / downsample` is the token grid (the checkpoint
        does not record it: 256px ds16 -> 16x16, 384px -> 24x24). weights: the file's entry to read; None = what
        LlamaGen's sampling scripts read ("model", else "module", else "state_dict"), "ema" for the EMA copy a
        training run kept. Entries that are not weights (a KV cache saved with the model) are ignored and logged; a
        missing weight is refused by name. `config` overrides any field (the GPT follows LlamaGen's caption masking,
        `null_caption_mask="prompt"`).
        """
        state = load_official_state_dict(path, SAMPLING_KEYS, weights)
        if "tok_embeddings.weight" not in state:
            raise ValueError(f"{path} has no 'tok_embeddings.weight': not a LlamaGen GPT checkpoint")
        if image_size % downsample:
            raise ValueError(f"image_size ({image_size}) must be a multiple of downsample ({downsample})")
        vocab_size, dim = state["tok_embeddings.weight"].shape
        sizes = {width: heads for width, _, heads in OFFICIAL_SIZES.values()}
        inferred = {
            "vocab_size": vocab_size,
            "dim": dim,
            "n_layer": 1 + max(int(k.split(".")[1]) for k in state if k.startswith("layers.")),
            "n_head": sizes.get(dim),
            "grid_size": image_size // downsample,
            "ffn_dim_multiplier": None,
        }
        if "cls_embedding.embedding_table.weight" in state:
            inferred.update(model_type="c2i", cls_token_num=1,
                            num_classes=state["cls_embedding.embedding_table.weight"].shape[0] - 1)
        elif "cls_embedding.cap_proj.fc1.weight" in state:
            null = state.get("cls_embedding.uncond_embedding")  # if missing, the load below names it
            inferred.update(model_type="t2i", cls_token_num=120 if null is None else null.shape[0],
                            caption_dim=state["cls_embedding.cap_proj.fc1.weight"].shape[1])
        inferred.update(config)
        if inferred["n_head"] is None:
            raise ValueError(f"width {dim} is not an official LlamaGen size ({sorted(sizes)}); pass n_head=")
        hidden = state["layers.0.feed_forward.w1.weight"].shape[0]
        model = cls(**inferred)
        if model.layers[0].feed_forward.w1.out_features != hidden:
            raise ValueError(f"{path}: feed-forward width {hidden} does not follow from dim {dim}; pass "
                             "multiple_of= / ffn_dim_multiplier=")
        load_weights(model, state, str(path), KNOWN_EXTRAS)
        return model.eval()
