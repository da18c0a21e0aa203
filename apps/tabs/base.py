"""What every demo tab shares: the tab protocol, the stats table, and turning bad input into a message in the UI."""

from __future__ import annotations

import functools
import inspect
import logging
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import gradio as gr
import PIL.Image

from mmspec.core.stats import SpecStats

# Every model call of the demo runs on this one thread, so calls are serialised (one device, requests queue) and only
# one thread ever drives torch's OpenMP pool: on CPU, a second thread doing torch work (Gradio's handler threads next
# to the thread that loaded the models) made the embedded models' decoding twice as slow.
COMPUTE = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmspec-compute")

LOG = logging.getLogger("mmspec.demo")

STATS_HEADERS = ["method", "target forwards", "tokens / forward", "latency (s)", "speedup", "distortion / position"]


class Tab(Protocol):
    """A demo tab around one pipeline. `build()` lays out its components inside the current `gr.Blocks`;
    `warm_up_calls()` lists (name, call) pairs, one short call per method to run on the compute thread so that no
    user request is timed with lazy initialisation; `cold` holds the names not warmed yet (the demo's `WarmUp` keeps
    it), and a tab runs AR where a request asks for "auto" while "auto" is cold (`while_cold`)."""

    title: str
    cold: set[str]

    def build(self) -> None: ...

    def warm_up_calls(self) -> list[tuple[str, Callable[[], object]]]: ...


def while_cold(tab: Tab, method: str) -> tuple[str, str]:
    """(the method a request runs, a note for its status): "auto" runs AR while the warm-up has not timed auto's
    candidates yet (that takes minutes on a CPU, and would hold every request queued behind it)."""
    if method == "auto" and "auto" in tab.cold:
        return "ar", " The warm-up is still timing auto's candidates: this request ran AR in its place."
    return method, ""


def stats_row(label: str, stats: SpecStats, latency: float, baseline_latency: float) -> list[str]:
    """One row of STATS_HEADERS. Distortion is LANTERN / typical acceptance's realised excess acceptance per tested
    position (the per-position TV distance of the output law from the model's); exact methods show 0."""
    distortion = "—" if stats.drafted == 0 else f"{stats.excess_acceptance or 0.0:.3f}"
    return [label, str(stats.target_forwards), f"{stats.tokens_per_target_forward:.2f}", f"{latency:.3f}",
            f"{baseline_latency / latency:.2f}", distortion]


def check_prompt(prompt) -> str:
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("Enter a prompt: the prompt is empty.")
    return prompt


def check_number(name: str, value, low: float, high: float, integer: bool = False) -> float | int:
    """`value` if it is a number in [low, high] (an integer when `integer`), else a ValueError naming the control."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ValueError(f"{name} must be a number, got {value!r}")
    if integer and value != int(value):
        raise ValueError(f"{name} must be a whole number, got {value}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {_show(low)} and {_show(high)}, got {_show(value)}")
    return int(value) if integer else float(value)


def _show(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


def shows_errors(fn: Callable) -> Callable:
    """Wrap an event handler (function or generator) so that a ValueError / TypeError from bad input reaches the page
    as a `gr.Error` message and the server log as one line (no traceback: it is the user's input, not a fault); the
    server stays up and the failed request does not disturb the queue."""
    def invalid_input(error: Exception) -> gr.Error:
        LOG.warning("invalid input to %s: %s", fn.__name__, error)
        return gr.Error(str(error), title="Invalid input", print_exception=False)

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except (ValueError, TypeError) as error:
                raise invalid_input(error) from error
    else:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except (ValueError, TypeError) as error:
                raise invalid_input(error) from error
    return wrapper


class StreamedImages:
    """PNG files for the image outputs of a streaming handler, one set per yield.

    Handing Gradio files instead of PIL images matters: Gradio caches a PIL output under the hash of its bytes and
    rewrites that file in place each time the same picture is sent again (AR's acceptance map is the same every run),
    so a browser still reading the earlier copy gets a truncated file; a file output is copied atomically instead.
    Gradio has copied a yield's files by the time the handler resumes, so `next_yield()` deletes them; leaving the
    `with` block deletes the rest.
    """

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="mmspec-demo-"))
        self._sent: list[Path] = []

    def __enter__(self) -> StreamedImages:
        return self

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def save(self, image: PIL.Image.Image | None) -> str | None:
        if image is None:
            return None
        path = Path(tempfile.mkstemp(suffix=".png", dir=self.folder)[1])
        image.save(path)
        self._sent.append(path)
        return str(path)

    def next_yield(self) -> None:
        for path in self._sent:
            path.unlink(missing_ok=True)
        self._sent.clear()
