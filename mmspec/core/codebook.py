"""A VQ codebook's geometry, what the relaxed acceptance rules (`mmspec.core.rules`) read from a model: visual AR
models spread probability over many interchangeable codes, and these rules accept a draft on the mass of the codes
near it.

- `NeighbourTable`: for each code its `k_max` nearest codes under the geometry the quantizer uses (the adapter's
  `codebook()`, l2-normalised when the quantizer normalises; the official LANTERN code uses the raw weights), self
  excluded, nearest first, built in row chunks (never a V x V matrix), stored as int16 / int32 and cached on disk
  under a hash of the codebook, so a table can never be applied to another codebook.
- `token_embeddings`: the unit-norm code vector of every token id (the geometry of rules that group codes).

An adapter opts in by exposing `codebook() -> [C, d]`; when its token ids are not the code indices (special tokens,
offsets) it also exposes `codebook_token_ids: [C] long`, the token id of each code. Tokens that are not codes are
never relaxed.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from mmspec.core.paths import cache_root

DEFAULT_K_MAX = 1000  # the official CLI's --lantern_k; tables are built this wide (or V - 1) so any k <= it reuses them
CHUNK_ROWS = 1024  # rows of the distance matrix computed at once: [1024, V] floats


def cache_dir() -> Path:
    """Where neighbour tables are cached: $MMSPEC_CACHE_DIR/lantern, default ~/.cache/mmspec/lantern."""
    return cache_root() / "lantern"


def codebook_hash(codebook: torch.Tensor) -> str:
    """sha256 of a codebook [C, d] (its shape and float32 values)."""
    values = codebook.detach().to("cpu", torch.float32).contiguous()
    return hashlib.sha256(str(tuple(values.shape)).encode() + values.numpy().tobytes()).hexdigest()


def nearest_codes(codebook: torch.Tensor, k_max: int, chunk_rows: int = CHUNK_ROWS) -> torch.Tensor:
    """The k_max nearest other codes of every code by L2 distance: codebook [C, d] -> [C, k_max] (int16 when C fits,
    else int32), nearest first. Distances are computed CHUNK_ROWS rows at a time, so memory is [chunk_rows, C]."""
    C = codebook.shape[0]
    if not 0 <= k_max <= C - 1:
        raise ValueError(f"k_max must be in [0, {C - 1}] (codes other than self), got {k_max}")
    codebook = codebook.detach().float()
    dtype = torch.int16 if C <= torch.iinfo(torch.int16).max + 1 else torch.int32
    table = torch.empty(C, k_max, dtype=dtype)
    for start in range(0, C, chunk_rows):
        rows = torch.arange(start, min(start + chunk_rows, C), device=codebook.device)
        distance = torch.cdist(codebook[rows], codebook)  # [rows, C]
        distance[torch.arange(len(rows)), rows] = torch.inf  # self excluded
        table[rows.cpu()] = distance.topk(k_max, dim=-1, largest=False, sorted=True).indices.cpu().to(dtype)
    return table


@dataclass(frozen=True)
class NeighbourTable:
    """indices: [C, k_max] int16 / int32, row c = the codes nearest to code c, nearest first, c excluded.
    codebook_hash: `codebook_hash` of the codebook it was built from."""

    indices: torch.Tensor
    codebook_hash: str

    @property
    def k_max(self) -> int:
        return self.indices.shape[1]

    @classmethod
    def build(cls, codebook: torch.Tensor, k_max: int | None = None, cache: str | Path | bool = True) -> NeighbourTable:
        """The table of `codebook` [C, d] with k_max (default min(DEFAULT_K_MAX, C - 1)) neighbours per code.

        cache: True = `cache_dir()`, a folder, or False. A cached table at least k_max wide for the same codebook
        hash is loaded (and sliced) instead of being rebuilt.
        """
        C = codebook.shape[0]
        k_max = min(DEFAULT_K_MAX, C - 1) if k_max is None else k_max
        digest = codebook_hash(codebook)
        folder = None if cache is False else (cache_dir() if cache is True else Path(cache))
        path = None if folder is None else folder / f"{digest[:32]}.pt"
        if path is not None and path.exists():
            stored = torch.load(path, weights_only=True)["indices"]
            if stored.shape[1] >= k_max:
                return cls(stored[:, :k_max].contiguous(), digest)
        table = cls(nearest_codes(codebook, k_max), digest)
        if path is not None:  # written whole, then renamed: concurrent processes never read a partial file
            folder.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f"{path.stem}.{os.getpid()}.partial")
            torch.save({"indices": table.indices, "codebook_hash": digest}, partial)
            os.replace(partial, path)
        return table

    def check(self, codebook: torch.Tensor) -> None:
        """Raise if this table was built for another codebook."""
        digest = codebook_hash(codebook)
        if digest != self.codebook_hash:
            raise ValueError(
                f"the neighbour table was built for another codebook (hash {self.codebook_hash[:12]}…); this model's "
                f"codebook hashes to {digest[:12]}…: build one with NeighbourTable.build(codebook)"
            )

    def in_token_space(self, vocab_size: int, token_ids: torch.Tensor | None = None) -> torch.Tensor:
        """[vocab_size, k_max] int32 neighbour token ids, -1 rows for tokens that are not codes.

        token_ids: [C] long, the token id of each code (default: code c is token c).
        """
        indices = self.indices.int()
        if token_ids is None:
            if vocab_size != indices.shape[0]:
                raise ValueError(
                    f"the codebook has {indices.shape[0]} codes but the vocabulary {vocab_size} ids: the adapter must "
                    f"expose codebook_token_ids (the token id of each code)"
                )
            return indices
        token_ids = token_ids.long().cpu()
        table = torch.full((vocab_size, self.k_max), -1, dtype=torch.int32)
        table[token_ids] = token_ids[indices.long()].int()
        return table


_TABLES: dict[tuple[str, int], NeighbourTable] = {}  # per process, so repeated calls do not reload the file


def model_codebook(model) -> torch.Tensor:
    """The adapter's codebook [C, d] in its quantizer's geometry, on the model's device; raises for models without
    one."""
    if not callable(getattr(model, "codebook", None)):
        raise TypeError(
            f"relaxed acceptance needs a model with a VQ codebook: the adapter must expose "
            f"codebook() -> [C, d]; {type(model).__name__} has none"
        )
    return model.codebook().detach().float()


def model_neighbours(model, vocab_size: int, k: int) -> torch.Tensor:
    """[vocab_size, k] the k nearest codes of every token of `model`'s codebook in token ids (-1 rows for tokens
    that are not codes), on the codebook's device; the table is built once per codebook (at least
    min(DEFAULT_K_MAX, C - 1) wide, so any k up to it reuses it), cached on disk and in the process."""
    codebook = model_codebook(model)
    key = (codebook_hash(codebook), max(k, min(DEFAULT_K_MAX, codebook.shape[0] - 1)))
    if key not in _TABLES:  # keyed by the codebook's hash, so a table never meets another codebook
        _TABLES[key] = NeighbourTable.build(codebook, key[1])
    neighbours = _TABLES[key].in_token_space(vocab_size, getattr(model, "codebook_token_ids", None))
    return neighbours[:, :k].to(codebook.device)  # moved once, not per verification


def token_embeddings(codebook: torch.Tensor, vocab_size: int, token_ids: torch.Tensor | None = None) -> torch.Tensor:
    """[vocab_size, d]: row t the unit-norm codebook vector of token t, zero for tokens that are not codes.
    codebook: [C, d]; token_ids: [C] long, the token id of each code (default: code c is token c)."""
    if token_ids is None and codebook.shape[0] != vocab_size:
        raise ValueError(f"the codebook has {codebook.shape[0]} codes but the vocabulary {vocab_size} ids: the adapter "
                         "must expose codebook_token_ids (the token id of each code)")
    ids = torch.arange(codebook.shape[0]) if token_ids is None else token_ids.long().cpu()
    vectors = torch.zeros(vocab_size, codebook.shape[1], dtype=codebook.dtype, device=codebook.device)
    vectors[ids.to(codebook.device)] = torch.nn.functional.normalize(codebook, dim=-1)
    return vectors
