"""docs/errors.md's table of bad Python calls, run row by row on the embedded models: each raises exactly the
documented exception and message, at once (before any decoding or measuring). A message ending in "…)" is machine
dependent past that point (torch's version) and compared up to it."""

import re
import time
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors.md"
ROW = re.compile(r"\| (image|text|mar|video) \| `(.+)` \| `(\w+): (.*)` \|")


def python_rows() -> list[tuple[str, str, str, str]]:
    """(pipeline kind, call, exception name, message) of each Python row of docs/errors.md."""
    return [match.groups() for line in DOC.read_text().splitlines() if (match := ROW.fullmatch(line))]


@cache
def pipeline(kind: str):
    from mmspec import LlamaGenPipeline, MARPipeline, NextFramePipeline, SpeculativeTextPipeline

    pipe = {"image": lambda: LlamaGenPipeline.from_pretrained("shapes"),
            "text": lambda: SpeculativeTextPipeline.from_pretrained("pycode/target", draft="pycode/draft"),
            "mar": lambda: MARPipeline.from_pretrained("mar_shapes"),
            "video": lambda: NextFramePipeline.from_pretrained("nextframe_shapes")}[kind]()
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_the_table_covers_every_kind_of_pipeline():
    rows = python_rows()
    assert len(rows) >= 20 and {kind for kind, *_ in rows} == {"image", "text", "mar", "video"}


@pytest.mark.parametrize(("kind", "call", "exception", "message"), python_rows(),
                         ids=[f"{kind}: {call[:60]}" for kind, call, *_ in python_rows()])
def test_a_bad_call_raises_the_documented_error_at_once(kind, call, exception, message):
    if torch.cuda.is_available() and re.search(r"cuda|offload", call):
        pytest.skip("this machine has CUDA")
    pipe = pipeline(kind)
    started = time.perf_counter()
    with pytest.raises(Exception) as raised:  # noqa: PT011  the row names the exception; checked exactly below
        eval(call, {"pipe": pipe, "torch": torch, "frame": np.zeros((32, 32, 3), dtype=np.uint8)})  # noqa: S307
    seconds = time.perf_counter() - started
    assert type(raised.value).__name__ == exception
    said = str(raised.value)
    assert said.startswith(message[:-2]) if message.endswith("…)") else said == message
    assert seconds < 1, f"{seconds:.2f} s: work started before the check"
