"""A lookup-table image AR model implementing `mmspec.image.DiscreteImageModel`, for exact-law tests.

Every distinct prefix of image tokens has its own random logit row, per prompt and for the unconditional model, so
the next-token law depends on the whole prefix: a decoder that feeds a token at the wrong position, keeps a stale
one, or forgets to roll back sees different laws. The state mimics a KV cache: `forward` appends after each row's
kept tokens and `rollback` truncates per row.
"""

from dataclasses import dataclass

import torch

from mmspec.core.model import Logits
from mmspec.core.probs import SamplingConfig, process_logits
from tests.text.table_lm import Reversed


@dataclass
class TableState:
    prompts: torch.Tensor  # [B] long
    tokens: torch.Tensor  # [B, S] long, the "cached" image tokens
    length: torch.Tensor  # [B] long, tokens kept per row
    cfg: bool
    tree_start: torch.Tensor | None = None  # [B] the first slot of the last forward_tree's tree
    tree_offsets: torch.Tensor | None = None  # [B, P + T] the offsets of that tree's nodes so far
    cached: torch.Tensor | None = None  # [B, N] bool, positions committed through commit_segments
    segment_inputs: tuple | None = None  # (tokens, positions) [B, T] of the last forward_segments


class TableImageModel:
    capabilities = frozenset({"tree", "segments", "features"})

    def __init__(self, grid=(2, 3), vocab_size=4, prompts=2, forced_tokens=None, seed=0, scale=1.5):
        self.grid, self.vocab_size = grid, vocab_size
        self.N = grid[0] * grid[1]
        self.forced_tokens = forced_tokens
        V = vocab_size
        self.offsets = torch.tensor([sum(V**j for j in range(k)) for k in range(self.N)])  # code of a k-prefix
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(prompts + 1, int(self.offsets[-1]) + V ** (self.N - 1), V, generator=g,
                                 dtype=torch.float64) * scale  # row `prompts` = unconditional
        # draft heads read the logit rows as features (conditional rows, then their unconditional twins) through an
        # identity LM head
        self.embedding = torch.nn.Embedding(V, V, dtype=torch.float64)
        self.lm_head = torch.nn.Linear(V, V, bias=False, dtype=torch.float64)
        with torch.no_grad():
            self.lm_head.weight.copy_(torch.eye(V, dtype=torch.float64))
        self.layers = torch.nn.ModuleList([Reversed()])  # a "decoder layer" for EAGLE-3 heads to fuse
        self.layers_read = False  # the layer runs in every forward once a head has asked for it

    def feature_readout(self):
        return self.embedding, self.lm_head

    def feature_layers(self):
        self.layers_read = True
        return self.layers

    def _read_out(self, rows: torch.Tensor, B: int) -> Logits:
        """Logits of the table rows [B or 2B, ..., V] (with CFG: the unconditional twins after the B samples')."""
        if self.layers_read:
            self.layers[0](rows)  # its output, column for column beside the feature, is what a fusing head reads
        rows = self.lm_head(rows)
        return Logits(rows[:B], rows[B:] if rows.shape[0] > B else None)

    def codes(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Table row of the prefix tokens[b, :lengths[b, w]] for lengths [B, W]; prefixes longer than N - 1 only
        occur past the image (scratch) and read their first N - 1 tokens."""
        lengths = lengths.clamp(max=self.N - 1)
        V = self.vocab_size
        powers = V ** torch.arange(self.N - 2, -1, -1)  # [N - 1]
        prefix = (tokens[:, : self.N - 1] * powers).sum(-1, keepdim=True)  # base-V number of the first N - 1 tokens
        return self.offsets[lengths] + prefix // V ** (self.N - 1 - lengths)  # ... of the first lengths[b, w]

    def logits(self, state: TableState, lengths: torch.Tensor) -> Logits:
        return self.logits_of(state.tokens, state.prompts, lengths, state.cfg)

    def logits_of(self, tokens: torch.Tensor, prompts: torch.Tensor, lengths: torch.Tensor, cfg: bool) -> Logits:
        return self._read_out(self._table_rows(tokens, prompts, lengths, cfg), tokens.shape[0])

    def _table_rows(self, tokens: torch.Tensor, prompts: torch.Tensor, lengths: torch.Tensor,
                    cfg: bool) -> torch.Tensor:
        """The table rows [B, W, V] of the prefixes (`codes`), then with CFG the unconditional rows of the same."""
        code = self.codes(tokens, lengths)
        if cfg:
            prompts = torch.cat([prompts, torch.full_like(prompts, self.table.shape[0] - 1)])
            code = code.repeat(2, 1)
        return self.table[prompts[:, None], code]

    def logits_per_query(self, sequences: torch.Tensor, lengths: torch.Tensor, state: TableState) -> Logits:
        """Logits [B, T, V] of T queries per row, query t reading the first lengths[b, t] tokens of its own sequence
        sequences[b, t] (tree nodes and PJD's segment tokens each see a prefix of their own)."""
        B, T = lengths.shape
        rows = self._table_rows(sequences.reshape(B * T, -1), state.prompts.repeat_interleave(T),
                                lengths.reshape(B * T, 1), state.cfg)  # [(2) B T, 1, V]
        return self._read_out(rows.view(-1, T, rows.shape[-1]), B)

    def prefill(self, condition: torch.Tensor, cfg: bool, max_window: int = 1):
        B = condition.shape[0]
        # Room for windows that overhang the image and for a decoder that never rolls back (a mutation under test).
        state = TableState(condition, torch.zeros(B, self.N * (max_window + 1), dtype=torch.long),
                           torch.zeros(B, dtype=torch.long), cfg)
        return state, self.logits(state, torch.zeros(B, 1, dtype=torch.long))

    def forward(self, tokens: torch.Tensor, state: TableState) -> Logits:
        positions = state.length[:, None] + torch.arange(tokens.shape[1])
        state.tokens.scatter_(1, positions, tokens)
        state.length = state.length + tokens.shape[1]
        return self.logits(state, positions + 1)

    def forward_tree(self, tokens: torch.Tensor, offset: torch.Tensor, visible: torch.Tensor,
                     state: TableState) -> Logits:
        """Tree nodes [B, T] stored at the next slots like a KV cache, after the tree's P nodes of earlier calls;
        node t sits at position start + offset[t] (start: the tree's first slot) and its law reads the kept prefix
        and then the tree nodes it sees, each at its own position (tree attention)."""
        B, T = tokens.shape
        P = visible.shape[-1] - T
        offset, visible = offset.expand(B, T), visible.expand(B, T, P + T)
        state.tokens.scatter_(1, state.length[:, None] + torch.arange(T), tokens)
        state.tree_offsets = offset if P == 0 else torch.cat([state.tree_offsets, offset], 1)  # [B, P + T]
        start = state.length - P
        state.tree_start, state.length = start, state.length + T
        nodes = state.tokens.gather(1, start[:, None] + torch.arange(P + T))  # [B, P + T]
        at = start[:, None] + state.tree_offsets  # each node's position
        # a node writes its token at its position in the sequence of every node that sees it; the others write into
        # a dropped column (one query's visible nodes sit at distinct positions)
        column = torch.where(visible & (at < self.N)[:, None], at[:, None], self.N)  # [B, T, P + T]
        sequences = torch.cat([state.tokens[:, : self.N], torch.zeros(B, 1, dtype=torch.long)], 1)
        sequences = sequences[:, None].expand(B, T, -1).clone().scatter_(2, column, nodes[:, None].expand(B, T, -1))
        return self.logits_per_query(sequences[..., : self.N], start[:, None] + offset + 1, state)

    def keep_path(self, state: TableState, path: torch.Tensor) -> None:
        target = state.tree_start[:, None] + torch.arange(1, path.shape[1] + 1)
        source = torch.where(path >= 0, state.tree_start[:, None] + path, target)
        state.tokens.scatter_(1, target, state.tokens.gather(1, source))

    def forward_segments(self, tokens: torch.Tensor, positions: torch.Tensor, segments: torch.Tensor,
                         state: TableState) -> Logits:
        """PJD's row windows: token t's law reads, at every position before its own, the token of its segment there
        (itself included) if any, else the committed token if `commit_segments` cached it, else 0 (a hole)."""
        B, T = tokens.shape
        if state.cached is None:
            state.cached = torch.zeros(B, self.N, dtype=torch.bool)
        state.segment_inputs = (tokens, positions)
        sequences = torch.where(state.cached, state.tokens[:, : self.N], 0)[:, None].expand(B, T, self.N).clone()
        at = positions.clamp(max=self.N - 1)
        for source in range(T):  # input `source` is seen by the later inputs of its segment
            seen = (segments == segments[:, source, None]) & (torch.arange(T) >= source) & (positions[:, source, None]
                                                                                             < self.N)
            index = at[:, source, None, None].expand(B, T, 1)
            sequences.scatter_(2, index, torch.where(seen[..., None], tokens[:, source, None, None],
                                                     sequences.gather(2, index)))
        return self.logits_per_query(sequences, positions + 1, state)

    def commit_segments(self, state: TableState, keep: torch.Tensor) -> None:
        tokens, positions = state.segment_inputs
        rows, inputs = keep.nonzero(as_tuple=True)
        state.tokens[rows, positions[rows, inputs]] = tokens[rows, inputs]
        state.cached[rows, positions[rows, inputs]] = True

    def rollback(self, state: TableState, keep: torch.Tensor) -> None:
        state.length = keep.clone()

    def exact_law(self, prompt: int, sampling: SamplingConfig) -> torch.Tensor:
        """The AR joint law of all V^N token sequences [V^N] float64 (index = base-V number, first token most
        significant), enumerated with the real `process_logits`."""
        V, N = self.vocab_size, self.N
        sequences = torch.cartesian_prod(*[torch.arange(V)] * N) if N > 1 else torch.arange(V)[:, None]
        state = TableState(torch.full((len(sequences),), prompt), sequences, torch.zeros(len(sequences)), True)
        all_prefixes = torch.arange(N).expand(len(sequences), N)
        logits = self.logits(state, all_prefixes)
        p = process_logits(logits.cond, sampling, logits.uncond)  # [V^N, N, V]
        if self.forced_tokens is not None:
            forced = self.forced_tokens >= 0
            one_hot = torch.nn.functional.one_hot(self.forced_tokens.clamp(min=0), V).double()
            p = torch.where(forced[None, :, None], one_hot, p)
        return p.gather(-1, sequences[..., None]).squeeze(-1).prod(-1)
