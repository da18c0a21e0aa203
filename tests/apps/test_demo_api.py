"""The demo through its API (gradio_client against a demo launched in this process on a loopback port): streaming,
stats, LANTERN, the text tab, bad input and concurrent requests."""

import re
import threading

import numpy as np
import pytest
from gradio_client import Client
from PIL import Image

from mmspec.apps.tabs.image import setting_controls
from mmspec.apps.tabs.text import TextTab

PROMPT = "two small red triangles above a blue circle on a striped background"
IMAGE_DEFAULTS = dict(seed=0, guidance=3.0, temperature=1.0, top_k=0, method="sjd", acceptance="exact")
GREY = 128


@pytest.fixture
def client(demo_url):
    # files stay on the server (same machine): outputs are FileData dicts whose "path" we open. gradio_client >= 2.7
    # downloads each streamed file through a new TLS context, which starves the demo's compute thread here.
    client = Client(demo_url, verbose=False, download_files=False)
    yield client
    threading.Thread(target=client.close).start()  # close() waits a second for the heartbeat thread: not the tests


def generate_image(client, prompt=PROMPT, **overrides):
    """The image tab's API: the fixed inputs, then every generated setting control (`sjd_window`, `lantern_delta`,
    ...) at its default unless overridden."""
    fixed = {**IMAGE_DEFAULTS, **{key: value for key, value in overrides.items() if key in IMAGE_DEFAULTS}}
    settings = {control.key: control.default for control in setting_controls()}
    unknown = set(overrides) - set(fixed) - set(settings)
    assert not unknown, unknown
    settings.update({key: value for key, value in overrides.items() if key in settings})
    return client.submit(prompt, *fixed.values(), *settings.values(), api_name="/generate_image")


def speedup(table: dict, row: int) -> float:
    assert table["headers"][4] == "speedup"
    return float(table["data"][row][4])


def test_image_streams_partial_images_maps_and_stats(client):
    job = generate_image(client)
    final = job.result()
    updates = job.outputs()
    assert len(updates) >= 4 and updates[-1] == final

    # AR streams first: a partial image whose last token rows are still grey, and a map with grey cells
    partial = next(u for u in updates if u[5].startswith("AR:") and "committed" in u[5])
    committed = int(re.match(r"AR: (\d+) / 256 tokens committed", partial[5]).group(1))
    assert 0 < committed < 256 and partial[1] is None
    ar_partial = np.asarray(Image.open(partial[0]["path"]).convert("RGB"))
    assert ar_partial.shape == (256, 256, 3)
    assert (ar_partial[-16:, -16:] == GREY).all()  # the last token's cell is not generated yet
    assert (np.asarray(Image.open(partial[2]["path"]).convert("RGB"))[-16:, -16:] == GREY).all()
    # then the accelerated run streams while AR's finished image stays
    assert any(u[1] is not None and u[5].startswith("SJD") and "committed" in u[5] for u in updates)

    ar_image, fast_image, ar_map, fast_map, table, status = final
    for path in (ar_image, fast_image, ar_map, fast_map):
        pixels = np.asarray(Image.open(path["path"]).convert("RGB"))
        assert not (pixels == GREY).all(axis=-1).any()  # every cell committed
    assert [row[0] for row in table["data"]] == ["AR", "SJD"]
    ar_row, fast_row = table["data"]
    assert ar_row[1] == "256" and int(fast_row[1]) < 256 and float(fast_row[2]) > 1.5
    assert speedup(table, 0) == 1.0 and speedup(table, 1) > 0
    assert fast_row[5] == "0.000" and "AR's speed" in status
    # AR commits one token per forward: its map has as many colours as tokens; SJD's runs share colours
    colours = [len(np.unique(np.asarray(Image.open(m["path"]).convert("RGB"))[::16, ::16].reshape(-1, 3), axis=0))
               for m in (ar_map, fast_map)]
    assert colours[0] > 2 * colours[1]


def test_lantern_shows_its_realised_distortion(client):
    table, status = generate_image(client, acceptance="lantern", lantern_k=100, lantern_delta=0.2).result()[4:]
    assert table["data"][1][0] == "SJD + Lantern"
    assert float(table["data"][1][5]) > 0 and "Realised distortion" in status


def test_draft_model_method(client):
    table = generate_image(client, method="draft").result()[4]
    assert table["data"][1][0] == "DraftModel" and int(table["data"][1][1]) < 256


def test_pjd_method(client):
    """Parallel rows commit out of raster order: the accelerated image still ends with every cell committed."""
    table, status = generate_image(client, method="pjd").result()[4:]
    assert table["data"][1][0] == "PJD" and int(table["data"][1][1]) < 100


def test_text_tab_learns_online_when_asked(client):
    """The checkbox turns the pipeline's online drafting on: a draft-LM request is recorded; off again, none is."""
    settings = [c.default for c in TextTab.text_controls()]
    status = client.predict("def f(x):\n", "model", 1.0, 16, 0, *settings, True, "exact",
                            api_name="/complete_text")[3]
    assert "Online drafting: 1 requests recorded" in status and "of the draft LM" in status
    status = client.predict("def f(x):\n", "heads", 1.0, 16, 0, *settings, True, "exact",
                            api_name="/complete_text")[3]  # the head's own learner takes over
    assert "Online drafting: 1 requests recorded" in status and "of the eagle head" in status
    status = client.predict("def f(x):\n", "model", 1.0, 16, 0, *settings, False, "exact",
                            api_name="/complete_text")[3]
    assert "Online drafting" not in status


def test_text_tab_offers_judge_decoding(client):
    settings = [c.default for c in TextTab.text_controls()]
    status = client.predict("def f(x):\n", "model", 0.0, 24, 0, *settings, False, "judge",
                            api_name="/complete_text")[3]
    assert "Lossy (judge)" in status and "excess acceptance per position" in status


def test_text_tab_highlights_accepted_drafts(client):
    settings = [c.default for c in TextTab.text_controls()]
    ar_text, html, table, status = client.predict("def fibonacci(n):\n", "ngram", 0.0, 48, 0, *settings, False, "exact",
                                                  api_name="/complete_text")
    assert "identical to AR" in status
    assert [row[0] for row in table["data"]] == ["AR (target.generate)", "ngram: prompt lookup"]
    assert int(table["data"][1][1]) < 48 and float(table["data"][1][4]) > 0
    drafts = re.findall(r'<span class="draft" style="background:#[0-9a-f]{6}" title="forward (\d+)', html)
    targets = re.findall(r'<span class="target" title="forward (\d+)', html)
    assert drafts and len(drafts) + len(targets) == 48
    assert len(set(targets)) == len(targets)  # the target draws one token per forward


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(prompt="   "), "Enter a prompt: the prompt is empty."),
        (dict(seed=-3), "Seed must be between 0 and 2147483647, got -3"),
        # sliders and radios are range-checked by Gradio itself before the handler runs
        (dict(guidance=50.0), "Value 50.0 is greater than maximum value 10.0."),
        (dict(temperature=-1.0), "Value -1.0 is less than minimum value 0.0."),
        (dict(acceptance="lantern", lantern_delta=1.5), "delta must be in [0, 1], got 1.5"),
        (dict(method="beam"), "beam"),
        (dict(method="pjd", acceptance="lantern"), "PJD takes exact acceptance only"),
        (dict(method="auto", acceptance="lantern"), "auto chooses among the exact decodings: pick a method"),
    ],
)
def test_bad_input_is_a_clear_message_and_the_server_stays_up(client, overrides, message):
    prompt = overrides.pop("prompt", PROMPT)
    with pytest.raises(Exception, match=re.escape(message)):
        generate_image(client, prompt, **overrides).result()


def test_server_keeps_serving_after_bad_input(client):
    with pytest.raises(Exception, match="Enter a prompt"):
        generate_image(client, "").result()
    assert len(generate_image(client, seed=5).result()[4]["data"]) == 2


def test_two_concurrent_requests_both_complete(demo_url):
    clients = [Client(demo_url, verbose=False, download_files=False) for _ in range(2)]
    jobs = [generate_image(c, seed=s) for c, s in zip(clients, (1, 2))]
    tables = [job.result(timeout=120)[4] for job in jobs]
    for table in tables:
        assert len(table["data"]) == 2 and speedup(table, 1) > 0
    for c in clients:
        c.close()


def test_world_tab_steps_a_sequential_and_a_speculative_session(client):
    # episode, Euler steps, seed, then frame speculation's settings: frames, adaptive, frame cost, context
    seq, spec, table, status = client.predict(0, 2, 0, 4, False, 0.2, "pipelined", api_name="/start_world")
    assert "press an arrow" in status and table["data"][0][1] == "0"
    statuses = [client.predict(api_name=f"/world_{name}")[3] for name in ("right", "right", "right")]
    assert "block of 4" in statuses[0] and all("no model call" in s for s in statuses[1:])
    seq, spec, table, status = client.predict(api_name="/world_up")
    assert status.startswith("Frame 4 (up): the action changed")
    rows = {row[0]: row for row in table["data"]}
    assert rows["sequential"][1:5] == ["4", "4", "0", "0"]  # emitted, computed, discarded, rollbacks
    assert rows["speculative"][1:5] == ["4", "8", "1", "1"]
    assert float(rows["sequential"][7]) == 1.0 and float(rows["speculative"][6]) > 0
    for path in (seq, spec):
        assert Image.open(path["path"]).size == (256, 256)


def test_world_tab_asks_to_start_first(demo_url):
    client = Client(demo_url, verbose=False, download_files=False)
    with pytest.raises(Exception, match="Press Start first"):
        client.predict(api_name="/world_left")
    client.close()
