"""The demo's pieces without a server: acceptance heat maps, draft highlighting, input checks, early interruption."""

import numpy as np
import pytest

from mmspec.apps.demo import QUEUE_POLL_S, build_demo, relax_queue_polling
from mmspec.apps.tabs.base import COMPUTE, check_number
from mmspec.apps.tabs.image import NOT_YET, VIRIDIS, Preview, Result, acceptance_heatmap, stream_decoding
from mmspec.apps.tabs.text import highlight_pieces
from mmspec.pipelines.text import TokenPiece


def test_heatmap_colours_by_forward_on_one_scale():
    forwards = np.array([[0, 0, 1, 1], [2, 2, 2, 255], [-1, -1, -1, -1], [3, 3, 3, 3]])
    picture = np.asarray(acceptance_heatmap(forwards, num_tokens=256, size=4)).astype(float)
    assert (picture[2] == NOT_YET).all()  # not committed yet: grey
    assert (picture[0, 0] == VIRIDIS[0]).all() and (picture[1, 3] == (VIRIDIS[-1] * 0.8).round()).all()
    assert (picture[1, 0] == picture[1, 2]).all()  # one forward, one colour
    assert not (picture[0, 1] == picture[0, 2]).all()  # neighbouring forwards differ
    assert np.asarray(acceptance_heatmap(forwards, 256)).shape == (256, 256, 3)


def test_highlight_marks_accepted_drafts_by_forward_and_escapes_text():
    pieces = [TokenPiece("<a>", 1, True), TokenPiece(" &", 1, False), TokenPiece("x", 2, True)]
    html = highlight_pieces(pieces)
    assert html.count('class="draft"') == 2 and html.count('class="target"') == 1
    assert "&lt;a&gt;" in html and " &amp;" in html and "<a>" not in html
    assert 'title="forward 1: accepted draft token"' in html and 'title="forward 2: accepted draft token"' in html
    backgrounds = [part.split('"')[0] for part in html.split("background:")[1:]]
    assert backgrounds[0] != backgrounds[1]


@pytest.mark.parametrize(
    "value,integer,message",
    [("3", False, "must be a number"), (float("nan"), False, "must be a number"), (True, False, "must be a number"),
     (2.5, True, "must be a whole number"), (11, False, "must be between 1 and 10, got 11"),
     (0.5, False, "must be between 1 and 10, got 0.5")],
)
def test_check_number_names_the_control(value, integer, message):
    with pytest.raises(ValueError, match=f"Guidance scale {message}"):
        check_number("Guidance scale", value, 1, 10, integer=integer)


def test_build_demo_rejects_unknown_tabs():
    with pytest.raises(ValueError, match="non-empty mapping"):
        build_demo({})
    with pytest.raises(ValueError, match=r"no demo tab for \['audio'\]; tab kinds: \['image', 'text', 'world'\]"):
        build_demo({"audio": object()})


def test_the_idle_queue_polls_every_50_ms_not_every_millisecond():
    import gradio as gr

    with gr.Blocks() as demo:
        gr.Button()
    queue = demo.queue()._queue
    assert (queue.sleep_when_free, queue.progress_update_sleep_when_free) == (0.001, 0.01)  # Gradio's own
    relax_queue_polling(demo)
    assert (queue.sleep_when_free, queue.progress_update_sleep_when_free) == (QUEUE_POLL_S, QUEUE_POLL_S)


def test_closing_a_stream_interrupts_the_pipeline(zoo_pipes):
    pipe = zoo_pipes["image"]
    events = stream_decoding(pipe, "a large white square on a checkered background", 0, {"decoding": "ar"},
                             preview_interval=0.0)
    first = next(events)
    assert isinstance(first, Preview) and first.committed < 256
    events.close()  # what Gradio does when the browser goes away
    assert pipe.interrupt
    assert COMPUTE.submit(lambda: "free").result(timeout=10) == "free"
    finished = list(stream_decoding(pipe, "a large white square on a checkered background", 0, {"decoding": "sjd"},
                                    preview_interval=1e9))
    assert isinstance(finished[-1], Result) and finished[-1].stats.target_forwards < 256
    assert (finished[-1].acceptance_map >= 0).all()
