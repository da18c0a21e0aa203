"""Draft heads on the target's own features: an EAGLE head (Li et al. 2024, arXiv 2401.15077) and Hydra heads
(Ankner et al. 2024, arXiv 2402.05109), and the per-batch sessions that draft with them
(`mmspec.core.drafting.heads.HeadProposer` drives a session).

Both read the target's *feature*, the input of its LM head (post-norm last hidden state), and read their own
predictions out through the target's frozen embedding and LM head (`bind`), so a head owns only its small body:

- `EagleHead`: one pre-norm decoder layer over pairs (embedding of token x_j, feature f_{j-1} of the token before),
  fused by FC(2d -> d), predicting the feature f_j (whose LM-head law is that of x_{j+1}). It autoregresses on
  features: a drafted token's pair takes the head's own prediction for its parent. With `feature_layers`, a token the
  target has scored pairs with EAGLE-3's fused feature instead of f (Li et al. 2025, arXiv 2503.01840): the outputs of
  those decoder layers beside f, FC([norm(h_a); norm(h_b); ...; f] -> d), which starts as f alone. Its layer attends
  over the pairs before it through a KV cache of its own (tree nodes: their ancestors), with rotary positions (1-D
  for text, the target grid's 2-D table for images).
- `HydraHead`: sequentially dependent MLP heads, no attention. Head k sees the feature h of the token before the last
  committed one and the embeddings of the last committed token and the k drafts after it (the tokens chosen by heads
  0 .. k - 1), [h; E(x); E(d_1); ...; E(d_k)] -> MLP -> h + delta, the predicted feature of d_k; it drafts at most
  `num_heads` tokens a round.

Shapes: R cache rows (B samples, 2B with classifier-free guidance: conditional rows then their twins), d the
target's feature width, V its vocabulary, W a window, S the EAGLE session's cache slots, F frontier nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn

from mmspec.adapters.causal_lm import CFGRows
from mmspec.core.model import Logits
from mmspec.core.runtime.capture import kept_in_place
from mmspec.models.llamagen.gpt import TransformerBlock, rope_table_2d


class TargetReadout:
    """The target's frozen token embedding and LM head, shared with a head (never saved with it)."""

    def bind(self, embedding: nn.Module, lm_head: nn.Module) -> None:
        """Read tokens in and features out through the target's `embedding` (ids [...] -> [..., d]) and `lm_head`
        ([..., d] -> logits [..., V]): a transformers LM's, or an image family's readout of its image tokens
        (`mmspec.adapters.views.Readout`)."""
        d = self.config.feature_size
        with torch.no_grad():  # one token through both, for their widths (forward: no hook of the target's fires)
            embedded = embedding(torch.zeros(1, dtype=torch.long, device=next(lm_head.parameters()).device))
            width, V = embedded.shape[-1], lm_head.forward(embedded.to(next(lm_head.parameters()).dtype)).shape[-1]
        if width != d:
            raise ValueError(f"the head reads features of width {d}; the target's embedding and LM head read {width}")
        if V != self.config.vocab_size:
            raise ValueError(f"the head was trained for a vocabulary of {self.config.vocab_size}; the target's LM "
                             f"head has {V}")
        # plain attributes, not submodules: the target's weights are neither trained nor saved with the head
        self.__dict__["embedding"], self.__dict__["lm_head"] = embedding, lm_head

    def tapped_layers(self, layers: Sequence[nn.Module]) -> list[nn.Module]:
        """Of the target's decoder `layers` (all of them, in order), those whose outputs the head reads beside its
        feature (`EagleHead`'s `feature_layers`; none for the others)."""
        wanted = tuple(self.config.get("feature_layers", ()))
        if wanted and max(wanted) >= len(layers):
            raise ValueError(f"the head reads the outputs of the target's decoder layers {list(wanted)}; the target "
                             f"has {len(layers)}")
        return [layers[i] for i in wanted]

    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype of the head's own weights (read off one: `ModelMixin.dtype` walks them all, on every draft)."""
        return next(self.parameters()).dtype

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embedding(tokens).to(self.weight_dtype)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Predicted features [..., d] -> float32 logits [..., V] through the target's LM head (its `forward`, so
        hooks on the target's head, such as its feature tap, do not fire)."""
        return self.lm_head.forward(hidden.to(next(self.lm_head.parameters()).dtype)).float()


class EagleHead(TargetReadout, ModelMixin, ConfigMixin):
    """One decoder layer over (token embedding, previous feature) pairs (see the module docstring).

    feature_size: the target's feature width d; vocab_size: its vocabulary; n_head: attention heads of the layer;
    ffn_hidden: its SwiGLU width; positions: "1d" (text, rotary over `max_positions`) or "2d" (images, the
    `grid_size` x `grid_size` grid's table, as LlamaGen's); acceptance: what `mmspec.zoo.train_heads` measured on
    held-out target samples, {"by_depth": [a_1, a_2, ...]} and for an image head "guided_by_depth" (the guided laws',
    which decoding accepts against) at "guidance_scale", with a_d = E[sum_x min(p, q)] the probability that a draft
    drawn from the head's law q at depth d is accepted against the target's p; the image pipelines'
    `decoding="auto"` predicts the head's chains from it; feature_sampling: FSPAD's feature sampling (Gui et al.
    2024, arXiv 2408.15562), as we read it: the feature alone does not say which token was drawn from its law, so the
    fused input also holds the feature sampled by that token's embedding, FC([E(x); f; E(x) * f]); feature_layers:
    the indices of the target's decoder layers whose outputs it fuses with f (EAGLE-3's fused feature, `fuse`;
    empty: f alone, as EAGLE and EAGLE-2 read)."""

    @register_to_config
    def __init__(self, feature_size: int = 192, vocab_size: int = 4096, n_head: int = 6, ffn_hidden: int = 512,
                 norm_eps: float = 1e-6, positions: str = "1d", max_positions: int = 2048, grid_size: int = 16,
                 rope_base: float = 10000.0, acceptance: dict | None = None, feature_sampling: bool = False,
                 feature_layers: tuple[int, ...] = ()):
        super().__init__()
        if positions not in ("1d", "2d"):
            raise ValueError(f"positions must be '1d' or '2d', got {positions!r}")
        if any(not isinstance(i, int) or i < 0 for i in feature_layers) or len(set(feature_layers)) < len(
                feature_layers):
            raise ValueError(f"feature_layers must be distinct layer indices >= 0, got {feature_layers!r}")
        if feature_layers:
            self.fuser = nn.Linear((len(feature_layers) + 1) * feature_size, feature_size)
            with torch.no_grad():  # f alone at first: [0 ... 0 I]
                self.fuser.weight.zero_()[:, -feature_size:] = torch.eye(feature_size)
                self.fuser.bias.zero_()
        self.fc = nn.Linear((3 if feature_sampling else 2) * feature_size, feature_size)
        self.layer = TransformerBlock(feature_size, n_head, n_head, ffn_hidden, norm_eps, 0.0, 0.0)
        head_dim = feature_size // n_head
        if positions == "2d":
            table = rope_table_2d(grid_size, head_dim, rope_base, 0)
        else:
            freqs = 1.0 / (rope_base ** (torch.arange(0, head_dim, 2).float() / head_dim))
            angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), freqs)
            table = torch.stack([angles.cos(), angles.sin()], -1)
        self.register_buffer("rope", table, persistent=False)  # [P, head_dim / 2, 2]

    def fuse(self, target_features: torch.Tensor) -> torch.Tensor:
        """The feature [..., d] a head's pair reads for a token the target scored, of what the target computed
        before it [..., (k + 1) d] (`FeatureTap`): the outputs of its k `feature_layers` (RMS-normalised, as the
        target's own layers read them) and its feature f, fused; f itself without `feature_layers`."""
        target_features = target_features.to(self.weight_dtype)
        if not self.config.feature_layers:
            return target_features
        d = self.config.feature_size
        outputs = target_features[..., :-d].unflatten(-1, (-1, d))
        normed = F.rms_norm(outputs, (d,), eps=self.config.norm_eps).flatten(-2)
        return self.fuser(torch.cat([normed, target_features[..., -d:]], -1))

    def forward(self, tokens: torch.Tensor, features: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                cache: tuple[torch.Tensor, torch.Tensor] | None = None,
                slots: torch.Tensor | None = None) -> torch.Tensor:
        """Predicted features [R, W, d] of tokens [R, W], each paired with the feature before it (features
        [R, W, d]) at rotary `positions` [R, W]; mask [R, 1, W, S] bool; with `cache` (k, v [R, H, S, D]) the window
        is written at `slots` [R, W] first (training: no cache, S = W)."""
        embedded, features = self.embed(tokens), features.to(self.weight_dtype)
        fused = [embedded, features, embedded * features] if self.config.feature_sampling else [embedded, features]
        x = self.fc(torch.cat(fused, -1))
        rope = self.rope[positions.clamp(0, self.rope.shape[0] - 1)]
        return self.layer(x, rope, mask, cache, slots)

    def session(self, rows: int, capacity: int, batch_size: int, cfg: bool, device) -> EagleSession:
        return EagleSession(self, rows, capacity, batch_size, cfg, device)


class HydraHead(TargetReadout, ModelMixin, ConfigMixin):
    """Sequentially dependent MLP heads (see the module docstring). num_heads: the most tokens drafted a round;
    hidden: each head's MLP width; acceptance: as `EagleHead`'s."""

    @register_to_config
    def __init__(self, feature_size: int = 192, vocab_size: int = 4096, num_heads: int = 4, hidden: int = 512,
                 acceptance: dict | None = None):
        super().__init__()
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear((k + 2) * feature_size, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(),
                          nn.Linear(hidden, feature_size))
            for k in range(num_heads))

    @property
    def num_heads(self) -> int:
        return len(self.mlps)

    def forward(self, root: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Head k = tokens.shape[-1] - 1: the predicted feature [..., d] of the last of `tokens` [..., k + 1] (the
        last committed token and k drafts), from the feature before them `root` [..., d]."""
        k = tokens.shape[-1] - 1
        if not 0 <= k < self.num_heads:
            raise ValueError(f"a Hydra head of {self.num_heads} heads drafts 1 to {self.num_heads} tokens; asked for "
                             f"head {k}")
        root = root.to(self.weight_dtype)
        return root + self.mlps[k](torch.cat([root, self.embed(tokens).flatten(-2)], -1))

    def session(self, rows: int, capacity: int, batch_size: int, cfg: bool, device) -> HydraSession:
        return HydraSession(self, batch_size, cfg, device)


class HeadSession(CFGRows):
    """A head drafting for one batch (`mmspec.core.drafting.heads.HeadProposer` drives it).

    prefill(tokens [R, T], features [R, T, w], positions [R, T], valid [R, T]) -> Logits [B, 1, V]: the pairs before
        the first round, right-aligned so that the last one is the last committed token; its law of the next token.
        features: what the `FeatureTap` of the head's `tapped_layers` reads (w = d, or (k + 1) d for an EAGLE head
        that fuses k layers' outputs).
    catch_up(tokens [R, W], features [R, W, w], start [R], committed [R]) -> Logits [B, 1, V]: re-read the tokens
        committed since the last round (model-view indices start .. committed - 1, padding after) with the target's
        features, and give the law after the last one.
    expand(nodes [B, F], paths [B, F, D], node_tokens [B, n], valid [B, F]) -> Logits [B, F, V]: the laws after the
        frontier nodes (`mmspec.core.drafting.tree_growth.grow_tree`'s callback; a chain is a tree of one child per
        node).
    end_round(): drop what drafting appended. select(index [B']): keep those samples.
    offsets: [B] long, what a row's model-view index adds to give its rotary position (text: the prompt before it).
    """

    def __init__(self, head, batch_size: int, cfg: bool, device):
        self.head, self.batch_size, self.cfg = head, batch_size, cfg
        self.offsets = torch.zeros(batch_size, dtype=torch.long, device=device)

    def split(self, logits: torch.Tensor) -> Logits:
        return Logits.from_rows(logits, self.batch_size, self.cfg)

    def select(self, index: torch.Tensor) -> None:
        self.offsets = self.offsets[index]
        self.batch_size = index.shape[0]


class EagleSession(HeadSession):
    """An EAGLE head's cache over one batch: the prefill's pairs in slots [0, T), model-view index m >= 1 at slot
    T - 1 + m (index 0, the last committed token at the start, closes the prefill), tree nodes after the deepest
    draft a row may reach (`nodes_start`)."""

    def __init__(self, head: EagleHead, rows: int, capacity: int, batch_size: int, cfg: bool, device):
        super().__init__(head, batch_size, cfg, device)
        c = head.config
        shape = (rows, c.n_head, capacity, c.feature_size // c.n_head)
        self.k = torch.zeros(shape, device=device, dtype=head.dtype)
        self.v = torch.zeros_like(self.k)
        self.valid = torch.zeros(rows, capacity, dtype=torch.bool, device=device)
        self.base = 0  # slot of model-view index 0
        self.root_hidden: torch.Tensor | None = None  # [R, d], the prediction at the last committed token
        self.node_hidden: torch.Tensor | None = None  # [R, n, d], the predictions at the tree's fed nodes
        self.fed: torch.Tensor | None = None  # [B, P] node indices fed this round, in slot order

    def _run(self, tokens, features, positions, slots, allowed) -> torch.Tensor:
        """Write the window at `slots` [R, W] and attend by `allowed` [R, W, S]; predicted features [R, W, d]."""
        # a query always sees its own slot, so a padding query has a finite output
        own = torch.zeros_like(allowed).scatter_(2, slots[:, :, None], True)
        return self.head(tokens, features, positions, (allowed | own)[:, None], (self.k, self.v), slots)

    def prefill(self, tokens, features, positions, valid) -> Logits:
        R, T = tokens.shape
        self.base = T - 1
        slots = torch.arange(T, device=tokens.device).expand(R, T)
        causal = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()
        allowed = torch.zeros(R, T, self.k.shape[2], dtype=torch.bool, device=tokens.device)
        allowed[:, :, :T] = causal & valid[:, None, :]
        hidden = self._run(tokens, self.head.fuse(features), positions, slots, allowed)
        self.valid[:, :T] = valid
        self.root_hidden = kept_in_place(self.root_hidden, hidden[:, -1])
        return self.split(self.head.logits(hidden[:, -1:]))

    def catch_up(self, tokens, features, start, committed) -> Logits:
        R, W = tokens.shape
        device = tokens.device
        start, committed = self.rows(start), self.rows(committed)
        index = start[:, None] + torch.arange(W, device=device)  # model-view indices
        slots = self.base + index
        S = self.k.shape[2]
        keys = torch.arange(S, device=device)
        kept = self.valid & (keys < (self.base + start)[:, None])  # the pairs before the window
        in_window = (keys[None, None, :] >= slots[:, :1, None]) & (keys[None, None, :] <= slots[:, :, None])
        hidden = self._run(tokens, self.head.fuse(features), self.rows(self.offsets)[:, None] + index, slots,
                           kept[:, None, :] | in_window)
        # in place, as every state a round leaves to the next: a captured step's next iteration reads these tensors
        self.valid.copy_(kept | ((keys >= (self.base + start)[:, None]) & (keys < (self.base + committed)[:, None])))
        last = (committed - 1 - start).clamp(0, W - 1)  # a row that committed nothing keeps junk it never commits
        self.root_hidden = kept_in_place(self.root_hidden,
                                         hidden.gather(1, last[:, None, None].expand(-1, 1, hidden.shape[-1]))[:, 0])
        return self.split(self.head.logits(self.root_hidden[:, None]))

    def begin_round(self, committed: torch.Tensor, view_width: int) -> None:
        """A round after committed [B] tokens of model views `view_width` wide: its drafts' slots follow the deepest
        position a row can reach."""
        self.committed, self.nodes_start = self.rows(committed), self.base + view_width + 1
        self.fed = torch.zeros(self.batch_size, 0, dtype=torch.long, device=committed.device)
        self.node_hidden = self.root_hidden.new_zeros(self.root_hidden.shape[0], 0, self.root_hidden.shape[-1])

    def expand(self, nodes, paths, node_tokens, valid) -> Logits:
        from mmspec.core.drafting.tree_growth import visible_slots

        B, F_ = nodes.shape
        depth = (paths >= 0).sum(-1)  # [B, F]; a node of depth k is the k-th draft after the last committed token
        parent = torch.where(depth > 1, paths.gather(2, (depth - 2).clamp(min=0)[..., None]).squeeze(-1), -1)
        columns = torch.cat([torch.full_like(nodes[:, :1], -1), self.fed], 1)  # the root (-1), then the fed nodes
        column = (columns[:, :, None] == parent[:, None, :]).long().argmax(1)  # [B, F]: each parent's column
        predictions = torch.cat([self.root_hidden[:, None], self.node_hidden], 1)
        parent_hidden = predictions.gather(1, self.rows(column)[..., None].expand(-1, -1, predictions.shape[-1]))
        visible = self.rows(visible_slots(self.fed, paths, nodes))  # [R, F, P + F]
        P = self.fed.shape[1]
        S = self.k.shape[2]
        slots = (self.nodes_start + P + torch.arange(F_, device=nodes.device)).expand(visible.shape[0], F_)
        keys = torch.arange(S, device=nodes.device)
        allowed = (self.valid & (keys < (self.base + self.committed)[:, None]))[:, None, :].expand(-1, F_, -1).clone()
        allowed[:, :, self.nodes_start : self.nodes_start + P + F_] = visible
        positions = self.rows(self.offsets)[:, None] + self.committed[:, None] - 1 + self.rows(depth)
        hidden = self._run(self.rows(node_tokens.gather(1, nodes)), parent_hidden, positions, slots, allowed)
        self.fed = torch.cat([self.fed, nodes], 1)
        self.node_hidden = torch.cat([self.node_hidden, hidden], 1)
        return self.split(self.head.logits(hidden))

    def end_round(self) -> None:
        self.fed = self.node_hidden = None  # the nodes' slots are never valid: the next round overwrites them

    def select(self, index: torch.Tensor) -> None:
        rows = self.sample_rows(index)
        self.k, self.v, self.valid = self.k[rows], self.v[rows], self.valid[rows]
        self.root_hidden = None if self.root_hidden is None else self.root_hidden[rows]
        super().select(index)


class HydraSession(HeadSession):
    """Hydra heads over one batch: a round needs only the feature before the last committed token."""

    def __init__(self, head: HydraHead, batch_size: int, cfg: bool, device):
        super().__init__(head, batch_size, cfg, device)
        self.root_feature: torch.Tensor | None = None  # [R, d]
        self.last: torch.Tensor | None = None  # [R] the last committed token

    def _root(self, feature: torch.Tensor, token: torch.Tensor) -> Logits:
        self.root_feature, self.last = kept_in_place(self.root_feature, feature), kept_in_place(self.last, token)
        return self.split(self.head.logits(self.head(feature, token[:, None])[:, None]))

    def prefill(self, tokens, features, positions, valid) -> Logits:
        return self._root(features[:, -1], tokens[:, -1])

    def catch_up(self, tokens, features, start, committed) -> Logits:
        last = self.rows(committed - 1 - start).clamp(0, tokens.shape[1] - 1)[:, None]
        return self._root(features.gather(1, last[..., None].expand(-1, 1, features.shape[-1]))[:, 0],
                          tokens.gather(1, last)[:, 0])

    def begin_round(self, committed: torch.Tensor, view_width: int) -> None:
        self.level = 0  # the depth of the last frontier expanded (grow_tree expands one level at a time)

    def expand(self, nodes, paths, node_tokens, valid) -> Logits:
        self.level += 1
        path_tokens = node_tokens.gather(1, paths[..., : self.level].clamp(min=0).flatten(1))
        tokens = torch.cat([self.last[:, None, None].expand(-1, nodes.shape[1], 1),
                            self.rows(path_tokens.view(*nodes.shape, self.level))], -1)  # [R, F, level + 1]
        root = self.root_feature[:, None].expand(-1, nodes.shape[1], -1)
        return self.split(self.head.logits(self.head(root, tokens)))

    def end_round(self) -> None:
        pass

    def select(self, index: torch.Tensor) -> None:
        rows = self.sample_rows(index)
        self.root_feature = None if self.root_feature is None else self.root_feature[rows]
        self.last = None if self.last is None else self.last[rows]
        super().select(index)
