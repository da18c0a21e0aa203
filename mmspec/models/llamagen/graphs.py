"""`WindowGraphs`: a LlamaGen transformer's decoding-loop window forwards, and whole decoding steps, replayed from CUDA
graphs.

On a GPU a small model's forward at batch 1 is bound by kernel launches, not FLOPs: the embedded 6 M-parameter model
takes 4 ms per forward on an H100 whatever the window. gpt-fast's answer is a static KV cache written by slot index
and one captured graph per input shape; `KVCache` already is such a cache (rollback lowers `lengths` in place), so a
window of W tokens after the cached prefix is one shape per W. `WindowGraphs` keeps a cache per transformer and
setting (rows, slots), hands it to one decoding at a time, and captures the window forward (embedding, blocks, head)
for each W on its first use; replaying it launches one graph. The capacity check and `max_length` (host-side) stay
outside the graph.

Its `steps` (`mmspec.core.runtime.capture.StepGraphs`) hold the decoding steps captured whole on this cache: the window
forward, verification, redraft, commit and rollback of K iterations in one graph (the decode loop replays them; inside
a step capture the window forward runs eagerly, so the step's graph holds it). A transformer whose modules a draft
head taps (`mmspec.adapters.features.FeatureTap`: hooks on its output head or blocks) runs its window forwards outside
a step capture eagerly too: a replayed window graph runs no hook, and the head would read a stale feature.
capture=False runs everything through the same static buffers without CUDA: the window forwards eagerly, the steps
through `TapeGraph`s, which replay with a CUDA graph's semantics (what the CPU tests check).
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from mmspec.core.runtime.capture import StepGraphs
from mmspec.models.llamagen.gpt import KVCache, LlamaGenTransformer, check_window_fits

WARMUP = 2  # eager runs on a side stream before a capture (the allocator and lazy kernel loading settle)
KEPT_CACHES = 4  # caches (with their graphs) a WindowGraphs keeps, one per rows / slots / dtype / device


class WindowGraphs:
    """`cache(rows, ...)` hands out a kept cache, emptied: one decoding at a time uses it. Caches are kept per
    (rows, device, dtype, slots), up to `KEPT_CACHES` (least recently used dropped first, with their graphs), so that
    calls that alternate settings (AR, then SJD with a wider window, as a comparison or the demo runs them) replay
    their graphs instead of capturing them again. `__call__(tokens [R, W] long)` appends a window to the cache in use
    and returns its logits [R, W, V] float32, as `transformer.forward_window(transformer.tok_embeddings(tokens),
    cache)` does, replaying W's graph. capture=False runs the same static-buffer steps eagerly (the path CPU tests
    take)."""

    capture_static = True  # kept across decodings: not a step's state

    def __init__(self, transformer: LlamaGenTransformer, capture: bool = True):
        self.transformer, self.capture = transformer, capture
        self.kept: KVCache | None = None  # the cache in use, its window graphs and its captured steps
        self.windows: dict[int, tuple[torch.cuda.CUDAGraph | None, torch.Tensor, torch.Tensor | None]] = {}
        self.steps = StepGraphs(cuda=capture)
        self.stores: OrderedDict[tuple, tuple[KVCache, dict, StepGraphs]] = OrderedDict()

    def cache(self, rows: int, device=None, dtype=None, extra_slots: int = 0) -> KVCache:
        """A kept cache, empty, for `rows` rows (arguments as `LlamaGenTransformer.new_cache`)."""
        device = torch.device(device or self.transformer.device)
        key = (rows, device, dtype or self.transformer.dtype, extra_slots)
        if key in self.stores:
            self.stores.move_to_end(key)
            self.kept, self.windows, self.steps = self.stores[key]
            self.kept.lengths.zero_()
            self.kept.key_valid.fill_(True)
            self.kept.max_length = 0
            return self.kept
        if self.capture and device.type != "cuda":
            raise ValueError(f"CUDA graphs need the model on a CUDA device, got {device}")
        self.kept, self.windows = self.transformer.new_cache(rows, device, dtype, extra_slots), {}
        self.kept.capture_static = True  # one cache for every decoding: a captured step's shell shares it
        self.steps = StepGraphs(cuda=self.capture)  # its graphs read and write this cache
        self.stores[key] = (self.kept, self.windows, self.steps)
        while len(self.stores) > KEPT_CACHES:
            self.stores.popitem(last=False)
        return self.kept

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        cache = self.kept
        if cache is None or tokens.ndim != 2 or tokens.shape[0] != cache.lengths.shape[0]:
            rows = None if cache is None else cache.lengths.shape[0]
            raise ValueError(f"tokens must be [{rows}, W] for the kept cache (from `cache()`), got "
                             f"{tuple(tokens.shape)}")
        W = tokens.shape[1]
        check_window_fits(cache, W)
        if self.tapped() or self.capture and torch.cuda.is_current_stream_capturing():  # a step capture records it
            cache.max_length += W
            return self._window(tokens)
        if W not in self.windows:
            self.windows[W] = self._capture(tokens)
        graph, static_tokens, static_logits = self.windows[W]
        static_tokens.copy_(tokens)
        if graph is None:
            logits = self._window(static_tokens)
        else:
            graph.replay()
            logits = static_logits.clone()  # the next replay overwrites the graph's output
        cache.max_length += W
        return logits

    def tapped(self) -> bool:
        """Whether hooks watch the transformer's output head or blocks (a draft head's feature tap)."""
        model = self.transformer
        return bool(model.output._forward_pre_hooks or any(layer._forward_hooks for layer in model.layers))

    def _window(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.transformer.append_window(self.transformer.tok_embeddings(tokens), self.kept)

    def _capture(self, tokens: torch.Tensor) -> tuple:
        """(graph or None, static tokens, static logits or None) for tokens' width."""
        static_tokens = tokens.clone()
        if not self.capture:
            return None, static_tokens, None
        lengths = self.kept.lengths.clone()
        stream = torch.cuda.Stream(tokens.device)
        stream.wait_stream(torch.cuda.current_stream(tokens.device))
        with torch.cuda.stream(stream):
            for _ in range(WARMUP):  # writes slots past the fill levels only, which a window overwrites anyway
                self._window(static_tokens)
                self.kept.lengths.copy_(lengths)
        torch.cuda.current_stream(tokens.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # records without running: the fill levels are still `lengths`
            static_logits = self._window(static_tokens)
        return graph, static_tokens, static_logits
