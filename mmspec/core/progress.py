"""The run contract every decoding shares: `component.run(...)` is a generator of `Progress`, one after every target
pass or block of them, and the last one it yields is its result (the tokens, and for text and continuous decodings
the sequences / latents with the stats). A caller drives progress bars, callbacks and interruption the same way for
every modality (`run_to_end`, which every pipeline calls):

    for progress in decoding.run(...):
        bar.update(progress.n_done - bar.n)
        if interrupted:
            progress.stop()  # the run ends where it stands; it may still yield its result
    result = progress

Closing the generator early also ends the run (the stats count what was committed), without a result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar


def _not_stoppable() -> None:
    raise RuntimeError("this progress was not yielded by a running decoding")


@dataclass(kw_only=True)
class Progress:
    """What a decoding has done after a target pass (or a block of them). step: 0-based count of what its modality
    steps by (verification steps, MAR steps, frames); n_done: what every row has finished (image or text tokens,
    known MAR tokens, frames), a host int. A modality's progress adds its tensors (the ones a pipeline's step
    callback may ask for, by attribute name)."""

    step: int
    n_done: int
    halt: Callable[[], None] = field(default=_not_stoppable, repr=False, compare=False)  # set by the run

    def stop(self) -> None:
        """End the run where it stands: it yields at most one more progress, its result."""
        self.halt()


class Halt:
    """A run's stop flag: `progress.halt` sets it, the run reads it before its next target pass."""

    def __init__(self):
        self.stopped = False

    def __call__(self) -> None:
        self.stopped = True


# on_step(progress) -> whether to stop: the hook `run_to_end` calls with every progress (the pipelines' step
# callbacks, progress bars and interruption)
StepHook = Callable[[Progress], bool]
P = TypeVar("P", bound=Progress)


def run_to_end(steps: Iterator[P], on_step: StepHook | None = None) -> P:
    """Drive a decoding's run to its end and return its last progress (its result): `on_step(progress)` after each
    one, where a true return stops the run (`Progress.stop`; the result that follows is not shown to `on_step`)."""
    last, stopped = None, False
    for progress in steps:
        last = progress
        if not stopped and on_step is not None and on_step(progress):
            progress.stop()
            stopped = True
    if last is None:
        raise RuntimeError("the decoding's run yielded no progress")
    return last
