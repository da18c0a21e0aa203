"""A decoding step replayed as one graph: the propose / verify / commit iteration of a speculative decoding, K
iterations at a time, with one host read per block of K instead of several per iteration.

A step (`ImageStep`, a text or continuous step) keeps its whole state in tensors that it updates in place, so that
the kernels of K calls, recorded once, redo K iterations when replayed. `StepRunner` drives a step in blocks:
- eagerly (`graphs=None`): K Python calls per block, then one host read of the progress;
- captured (`StepGraphs`): the first iteration of a decoding runs eagerly (it warms the allocator and takes the
  first-round branches), then every block replays a graph of K iterations. On CUDA the graph is a
  `torch.cuda.CUDAGraph`; on a CPU it is a `TapeGraph`, which records the same kernels and replays them with the same
  semantics (inputs and outputs at fixed tensors, Python scalars baked in, Python code not run), so the tests on a
  machine without a GPU run the exact replay path and catch what a CUDA graph would get wrong (a state tensor
  reassigned instead of updated, a Python counter read inside a step, a host read).

Graphs are kept across calls: a decoding's key (its settings, batch and sampling) finds the step captured before
(the "shell"), the new call's state is copied into the shell's tensors (`transfer`), and the graphs replay on them;
at the end the state goes back to the call's own step, whose `finish()` folds the stats. The caller's generators are
copied into private ones that the graphs drew with, and back, so a seed reproduces the eager run draw for draw.

`host_reads` counts the tensor reads that synchronise a device (`.item()`, `bool(t)`, `.tolist()`, `.cpu()`, ...);
`compiles_fullgraph` is the CPU proxy of capturability: `torch.compile(step, fullgraph=True, backend="eager")`
traces one iteration without a graph break (a break is a host read or a data-dependent shape).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import types
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

BLOCK_SIZES = (16, 8, 4, 2, 1)  # iterations per graph; a block never asks for more than the iterations left
KEPT_SHELLS = 8  # captured steps a StepGraphs keeps (least recently used dropped first)

# Ops whose result the host must read, or whose output shape depends on the data: no graph can hold them.
HOST_READ_OPS = frozenset({
    aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default, aten.bincount.default,
    aten._unique2.default, aten.unique_consecutive.default, aten.unique_dim.default,
})


NOT_STATE = (type, types.FunctionType, types.MethodType, types.BuiltinFunctionType, types.ModuleType, functools.partial)


class CaptureError(RuntimeError):
    """A step did something a graph cannot hold (a host read, a data-dependent shape)."""


class TapeGraph:
    """The replay semantics of a CUDA graph on any device: `capture(fn)` runs fn once and records every kernel
    (aten op) with the tensors it read and wrote; `replay()` runs the recorded kernels again on those same tensors,
    writing each output into the tensor recorded for it. Python code in fn does not run again, so a Python value
    read inside fn stays what it was at capture, as in a CUDA graph."""

    executes_capture = True  # capturing runs fn once (a CUDA capture only records)

    def __init__(self):
        self.ops: list[tuple[Any, tuple, dict, list[torch.Tensor]]] = []

    def capture(self, fn: Callable[[], None]) -> None:
        with _Recorder(self.ops):
            fn()

    def replay(self) -> None:
        for func, args, kwargs, outputs in self.ops:
            result = func(*args, **kwargs)
            for recorded, new in zip(outputs, _tensors(result), strict=True):
                if new.untyped_storage().data_ptr() != recorded.untyped_storage().data_ptr():
                    recorded.copy_(new)  # a fresh output: into the tensor the later kernels read


class _Recorder(TorchDispatchMode):
    def __init__(self, ops: list):
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in HOST_READ_OPS:
            raise CaptureError(f"{func} inside a captured step: a host read or a data-dependent shape, which a "
                               f"graph cannot hold")
        result = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, list(_tensors(result))))
        return result


def _tensors(result) -> Iterator[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        yield result
    elif isinstance(result, (tuple, list)):
        for item in result:
            yield from _tensors(item)


class CudaGraph:
    """`torch.cuda.CUDAGraph` behind `TapeGraph`'s interface: `capture(fn)` records fn's kernels (without running
    them) into `pool`, with `generators` registered so that each replay draws new numbers from them."""

    executes_capture = False

    def __init__(self, pool, generators: list[torch.Generator]):
        self.graph, self.pool, self.generators = torch.cuda.CUDAGraph(), pool, generators

    def capture(self, fn: Callable[[], None]) -> None:
        for generator in self.generators:
            self.graph.register_generator_state(generator)
        with torch.cuda.graph(self.graph, pool=self.pool):
            fn()

    def replay(self) -> None:
        self.graph.replay()


class StepGraphs:
    """The captured steps of one model (the target's adapter holds it): up to `KEPT_SHELLS` decodings' shells,
    each with its graphs per block size. cuda=False: `TapeGraph`s (a CPU run of the replay path)."""

    capture_static = True  # not per-call state (`state_tensors` does not walk it)

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.shells: OrderedDict[Any, Shell] = OrderedDict()

    def new_graph(self, shell: Shell):
        """A graph for `shell`, in the shell's memory pool (one per shell: a pool goes with the graphs in it)."""
        if not self.cuda:
            return TapeGraph()
        if shell.pool is None:
            shell.pool = torch.cuda.graph_pool_handle()
        return CudaGraph(shell.pool, shell.generators)


@dataclasses.dataclass
class Shell:
    """A step whose tensors the graphs read and write, its private generators, its graphs per block size and the
    Python counters of the stats one block of each size adds."""

    step: Any
    generators: list[torch.Generator]
    layout: dict[str, tuple]
    tensors: dict[str, torch.Tensor]
    graphs: dict[int, Any] = dataclasses.field(default_factory=dict)
    pool: Any = None
    counters: dict[int, dict[str, int]] = dataclasses.field(default_factory=dict)


def _reach(obj: Any) -> tuple[dict[str, torch.Tensor], dict[int, Any]]:
    """What a step reaches through its attributes (dataclasses, dicts, lists, its own objects): (its tensors by
    path, the objects that are not state by id: modules (weights), generators and objects marked `capture_static`
    (model adapters, graph stores, a graphs object's kept cache), which a walk does not enter)."""
    tensors: dict[str, torch.Tensor] = {}
    shared: dict[int, Any] = {}
    seen: set[int] = set()

    def walk(value, path):
        if isinstance(value, torch.Tensor):
            tensors[path] = value
            return
        if id(value) in seen or value is None or isinstance(value, (int, float, str, bool)):
            return
        seen.add(id(value))
        if isinstance(value, (torch.nn.Module, torch.Generator, torch.dtype, torch.device, *NOT_STATE)) or getattr(
                value, "capture_static", False):
            shared[id(value)] = value
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{path}[{key!r}]")
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, f"{path}[{i}]")
        elif hasattr(value, "__dict__"):
            for name, item in vars(value).items():
                walk(item, f"{path}.{name}")

    walk(obj, "step")
    return tensors, shared


def state_tensors(obj: Any) -> dict[str, torch.Tensor]:
    """Every tensor a step can reach through its attributes, by path (`_reach`): its state."""
    return _reach(obj)[0]


def copy_step(step: Any) -> Any:
    """A deep copy of a step's state, sharing what is not state (`_reach`)."""
    return copy.deepcopy(step, dict(_reach(step)[1]))


def layout_of(tensors: dict[str, torch.Tensor]) -> dict[str, tuple]:
    return {path: (tuple(t.shape), t.dtype, t.device) for path, t in tensors.items()}


def transfer(source: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> None:
    """Copy every state tensor of `source` onto the tensor at the same path of `target` (same layout). A broadcast
    view (a zero stride) is a constant, never state: no step writes it."""
    for path, tensor in source.items():
        into = target[path]
        broadcast = any(stride == 0 and size > 1 for stride, size in zip(into.stride(), into.shape, strict=True))
        if not broadcast and tensor.untyped_storage().data_ptr() != into.untyped_storage().data_ptr():
            into.copy_(tensor)


def kept_in_place(kept: torch.Tensor | None, value: torch.Tensor) -> torch.Tensor:
    """`value` written into `kept` (a step's state that the next iteration reads: a captured step writes the tensor
    it read), or a copy of it where there is no such tensor yet (None, or another shape: a first, eager round)."""
    if kept is None or kept.shape != value.shape:
        return value.clone()
    return kept.copy_(value)


def weights_of(value: Any) -> int | None:
    """Where the weights of a module (or of an adapter's first module attribute) start: a model's identity across
    the adapters made for it, in the keys of captured steps (which read those weights); None for anything else."""
    if not isinstance(value, torch.nn.Module):
        value = next((item for item in getattr(value, "__dict__", {}).values() if isinstance(item, torch.nn.Module)),
                     None)
    first = None if value is None else next(value.parameters(), None)
    return None if first is None else first.data_ptr()


def _generators(generator) -> list[torch.Generator]:
    if generator is None:
        return []
    return [generator] if isinstance(generator, torch.Generator) else list(generator)


@contextlib.contextmanager
def _timer_off(step) -> Iterator[None]:
    """The step's phase timer (its opening's, if it has one) off in the block: no host timer sees into a capture,
    and dynamo does not trace one."""
    timer = getattr(step, "timer", None)
    if timer is None:
        timer = getattr(getattr(step, "opening", None), "timer", None)
    enabled = timer is not None and timer.enabled
    if timer is not None:
        timer.enabled = False
    try:
        yield
    finally:
        if timer is not None:
            timer.enabled = enabled


def _counters(stats) -> dict[str, int]:
    return {name: value for name, value in vars(stats).items() if type(value) is int}


class StepRunner:
    """Drives a step in blocks of iterations (see the module docstring). `run(k)` does k iterations; `step` is the
    object whose `progress()` reports them (the shell while graphs replay); `finish()` hands the state back to the
    call's step and folds its stats. key: what makes two decodings' steps replayable by the same graphs."""

    def __init__(self, step, stats, timer, graphs: StepGraphs | None = None, key: Any = None):
        self.own, self.step, self.stats, self.timer, self.graphs, self.key = step, step, stats, timer, graphs, key
        self.user_generators = _generators(getattr(step, "generator", None))
        self.iterations = 0
        self.shell: Shell | None = None
        self.traced = False  # `trace_checks`: this decoding's iteration was traced

    def run(self, k: int) -> None:
        if _TRACE_CHECKS and not self.traced:  # the first iteration eager, the second traced
            if self.iterations == 0:
                self._eager(1)
                k -= 1
            if k:
                self._trace_check()
                self.traced, k = True, k - 1
            if not k:
                return
        if self.graphs is None or self.iterations == 0:
            self._eager(k if self.graphs is None else 1)
            if self.graphs is not None and k > 1:
                self.run(k - 1)
            return
        if self.shell is None:
            self.shell = self._shell()
        shell = self.shell
        if k not in shell.graphs:
            self._capture(shell, k)
            if shell.graphs[k].executes_capture:  # a tape ran the k iterations while recording them
                self._count(shell, k)
                return
        with self.timer("graph"):
            shell.graphs[k].replay()
        self._count(shell, k)

    def _trace_check(self) -> None:
        """`trace_checks`: run this iteration through `compiles_fullgraph` (default generator, timer off)."""
        step = self.own
        generator, step.generator = step.generator, None
        try:
            with _timer_off(step):
                _TRACE_CHECKS[-1].append(compiles_fullgraph(step))
        finally:
            step.generator = generator
        self.iterations += 1

    def _count(self, shell: Shell, k: int) -> None:
        """The stats' Python counters and the iterations of one block of k replayed."""
        for name, value in shell.counters[k].items():
            setattr(self.stats, name, getattr(self.stats, name) + value)
        self.iterations += k

    def _eager(self, k: int) -> None:
        with _side_stream(self.graphs is not None and self.graphs.cuda):
            for _ in range(k):  # the first iteration of a captured decoding warms up on a side stream
                self.own()
        self.iterations += k

    def _shell(self) -> Shell:
        """The captured step of this key with this call's state copied in (a new copy of this call's step if none
        fits): the graphs read and write the shell's tensors only, so the call's own step is left to `finish`."""
        own = state_tensors(self.own)
        layout = layout_of(own)
        shell = self.graphs.shells.get(self.key)
        if shell is None or shell.layout != layout or len(shell.generators) != len(self.user_generators):
            step = copy_step(self.own)
            private = [torch.Generator(g.device) for g in self.user_generators]
            if private:
                step.generator = private[0] if isinstance(self.own.generator, torch.Generator) else private
            shell = Shell(step, private, layout, state_tensors(step))
            self.graphs.shells[self.key] = shell
            while len(self.graphs.shells) > KEPT_SHELLS:
                self.graphs.shells.popitem(last=False)
        else:
            self.graphs.shells.move_to_end(self.key)
            transfer(own, shell.tensors)
        for mine, user in zip(shell.generators, self.user_generators, strict=True):
            mine.set_state(user.get_state())
        self.step = shell.step
        return shell

    def _capture(self, shell: Shell, k: int) -> None:
        graph = self.graphs.new_graph(shell)
        before = _counters(shell.step.stats)
        with _timer_off(shell.step):
            graph.capture(lambda: [shell.step() for _ in range(k)])
        after = _counters(shell.step.stats)
        shell.counters[k] = {name: after[name] - before[name] for name in before if after[name] != before[name]}
        for name in shell.counters[k]:
            setattr(shell.step.stats, name, before[name])  # the capture itself did no work
        shell.graphs[k] = graph

    def finish(self) -> None:
        """Hand the state (and the generators' positions) back to the call's step, then fold its stats."""
        if self.shell is not None:
            transfer(self.shell.tensors, state_tensors(self.own))
            for mine, user in zip(self.shell.generators, self.user_generators, strict=True):
                user.set_state(mine.get_state())
        self.own.finish()


class CallGraphs:
    """Calls of a function of tensors replayed from graphs, one per key (the function and every Python value it
    reads, the inputs' shapes): `graphs(key, fn, *inputs)` returns fn(*inputs) (a tensor or a tuple of tensors).
    The first call of a key runs eagerly (on a side stream on CUDA: it warms the allocator), the second captures fn
    on static copies of its inputs, and later calls copy their inputs in, replay and return copies of the outputs
    (the next replay overwrites the graph's). An input may be None (then the same for every call of the key). Each
    graph has its own memory pool: graphs of different keys replay in any order. cuda=False: `TapeGraph`s."""

    capture_static = True

    def __init__(self, cuda: bool, kept: int = 64):
        self.cuda, self.kept = cuda, kept
        self.seen: set[Any] = set()
        self.captured: OrderedDict[Any, tuple[Any, list, Any]] = OrderedDict()  # key -> (graph, inputs, outputs)

    def __call__(self, key: Any, fn: Callable[..., Any], *inputs: torch.Tensor | None) -> Any:
        if key in self.captured:
            self.captured.move_to_end(key)
            graph, static, outputs = self.captured[key]
            for buffer, value in zip(static, inputs, strict=True):
                if value is not None:
                    buffer.copy_(value)
            graph.replay()
            return _copied(outputs)
        if key not in self.seen:
            self.seen.add(key)
            with _side_stream(self.cuda):
                return fn(*inputs)
        static = [None if t is None else t.clone() for t in inputs]
        graph, captured = self._new_graph(), []
        graph.capture(lambda: captured.append(fn(*static)))
        if not graph.executes_capture:  # a CUDA capture only records: run it for this call
            graph.replay()
        self.captured[key] = (graph, static, captured[0])
        while len(self.captured) > self.kept:
            self.captured.popitem(last=False)
        return _copied(captured[0])

    def _new_graph(self):
        return CudaGraph(torch.cuda.graph_pool_handle(), []) if self.cuda else TapeGraph()


def _copied(outputs):
    return tuple(t.clone() for t in outputs) if isinstance(outputs, tuple) else outputs.clone()


@contextlib.contextmanager
def _side_stream(cuda: bool) -> Iterator[None]:
    """A side stream for a warm-up before a capture (on CUDA; nothing elsewhere)."""
    if not cuda:
        yield
        return
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        yield
    torch.cuda.current_stream().wait_stream(side)


def iterations_left(remaining: int, done: int, iterations: int, most_per_iteration: int) -> float:
    """The iterations a decoding is expected to need for the `remaining` tokens of its slowest row, for `block_size`:
    before its first iteration at the most tokens a step commits (`most_per_iteration`), so that a first block never
    runs past the end; then at the rate that row kept so far (`done` tokens in `iterations`), but no more than twice
    the iterations it has run (a rate read off a few iterations, whose drafts were still poor, is a poor guide)."""
    if iterations == 0:
        return remaining / most_per_iteration
    return min(remaining / max(done / iterations, 1.0), 2 * iterations)


def block_size(remaining_iterations: float, most: int | None = None) -> int:
    """The iterations of the next block, for every loop: the largest of `BLOCK_SIZES` that does not exceed the
    iterations a decoding is expected to have left (at least 1; blocks shrink towards the end, so few iterations run
    past it), and at most `most` (the caller's `block`)."""
    return min(most or BLOCK_SIZES[0], next((k for k in BLOCK_SIZES if k <= remaining_iterations), 1))


class HostReads:
    """Counts the tensor reads that block the host on a device (`item`, `tolist`, `bool`, `int`, `float`, `cpu`,
    `numpy`) while the block is open: `with HostReads() as reads: ...; reads.count`."""

    METHODS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy")

    def __init__(self):
        self.count = 0
        self._saved: dict[str, Any] = {}

    def __enter__(self) -> HostReads:
        for name in self.METHODS:
            original = getattr(torch.Tensor, name)
            self._saved[name] = original

            def counted(tensor, *args, _original=original, **kwargs):
                self.count += 1
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, counted)
        return self

    def __exit__(self, *exc) -> None:
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)


_TRACE_CHECKS: list[list] = []  # the result lists of the open `trace_checks` blocks


@contextlib.contextmanager
def trace_checks() -> Iterator[list[tuple[bool, str]]]:
    """While open, every decoding's second iteration runs through `compiles_fullgraph` (with the default generator:
    it draws other numbers than the call's, so use it on a measuring call, not for outputs); the block's list gets
    one (traced, reason) per decoding."""
    results: list[tuple[bool, str]] = []
    _TRACE_CHECKS.append(results)
    try:
        yield results
    finally:
        _TRACE_CHECKS.pop()


def compiles_fullgraph(step: Callable[[], None]) -> tuple[bool, str]:
    """(True, "") if one call of `step` traces with `torch.compile(fullgraph=True, backend="eager")` (it runs the
    iteration), else (False, the first graph break's reason). Dynamo cannot take a `torch.Generator` argument, so the
    caller runs it with the default generator."""
    import torch._dynamo

    torch._dynamo.reset()
    try:
        torch.compile(step, fullgraph=True, backend="eager")()
    except Exception as error:  # noqa: BLE001 - any failure to trace is the answer
        return False, f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
    finally:
        torch._dynamo.reset()
    return True, ""

