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


def test_the_warm_up_counts_its_calls_and_requests_for_auto_run_ar_meanwhile(zoo_pipes):
    """While the warm-up has not run auto's first call (which times its candidates for minutes on a CPU), an image or
    text request for auto runs AR and says so; its status counts the calls; a request is answered between warm-up
    calls (here, while the first one waits). Companion: once warmed, auto runs auto."""
    import threading

    from mmspec.apps.demo import WarmUp
    from mmspec.apps.tabs.base import while_cold
    from mmspec.apps.tabs.image import ImageTab
    from mmspec.apps.tabs.text import TextTab

    image, text = ImageTab(zoo_pipes["image"]), TextTab(zoo_pipes["text"])
    release, entered = threading.Event(), threading.Event()
    first = ("ar", lambda: (entered.set(), release.wait(60)))
    image.warm_up_calls = lambda: [first, ("auto", lambda: None)]
    text.warm_up_calls = lambda: [("auto", lambda: None)]
    warming = WarmUp({"image": image, "text": text}).start()
    assert entered.wait(60)
    assert image.cold == {"ar", "auto"} and text.cold == {"auto"}
    assert warming.status().startswith("⏳ Warming up: 0 of 3 calls done (now: the image tab's ar)")
    assert while_cold(image, "auto")[0] == "ar" and "ran AR in its place" in while_cold(text, "auto")[1]
    assert while_cold(image, "sjd") == ("sjd", "")
    release.set()
    assert warming.done.wait(60) and warming.error is None and warming.status() == ""
    assert image.cold == text.cold == set() and while_cold(image, "auto") == ("auto", "")


def test_each_tab_lists_one_warm_up_call_per_method(zoo_pipes):
    from mmspec.apps.tabs.image import ImageTab
    from mmspec.apps.tabs.text import TextTab
    from mmspec.apps.tabs.world import WorldTab

    image = ImageTab(zoo_pipes["image"])
    names = [name for name, _ in image.warm_up_calls()]
    assert names[:2] == ["ar", "auto"] and {"sjd", "lantern"} <= set(names) and len(names) == len(set(names))
    text = [name for name, _ in TextTab(zoo_pipes["text"]).warm_up_calls()]
    assert text[0] == "ar" and "auto" in text and len(text) == len(set(text))
    assert [name for name, _ in WorldTab(zoo_pipes["world"]).warm_up_calls()] == ["speculation"]
