"""`mmspec serve` on a local Ray instance (loopback only): concurrent requests batched, each answer equal to its
direct pipeline call; bad requests refused with one JSON line while the service keeps serving; a request past its
timeout given up; a replica killed under load restarted, with every request answered once."""

import base64
import concurrent.futures
import io
import json
import time

import numpy as np
import pytest
import torch
from PIL import Image

from mmspec.serving import client
from tests.conftest import embedded_text_pipeline
from tests.models.llamagen_tiny import tiny_pipeline
from tests.serving.test_requests import BAD_IMAGE_BODIES

pytestmark = pytest.mark.slow  # a Ray instance and five replicas: the slow tier

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
PORT = 8765
IMAGE_DECODING = {"decoding": "sjd", "window": 3}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """The tiny image model and the embedded text pair, 2 replicas each, batches of up to 8 rows."""
    from mmspec.serving.models import served_model
    from mmspec.serving.service import Limits, build_app, start, stop

    folder = tmp_path_factory.mktemp("tiny_image")
    tiny_pipeline().save_pretrained(folder)
    models = [served_model(str(folder), dtype="float64"), served_model("pycode/target")]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    start(build_app(models, replicas=2, limits=Limits(max_batch_size=8, batch_wait_ms=100)), port=PORT)
    yield {model.modality: model.id for model in models}
    stop()


def post(path: str, body, request_id: str | None = None) -> tuple[int, dict, bytes]:
    status, raw = client.post(f"http://127.0.0.1:{PORT}{path}", body, request_id)
    return status, json.loads(raw), raw


def concurrently(calls: list) -> list:
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda call: call(), calls))


def image_body(i: int) -> dict:
    return {"prompt": ["a red circle", "the blue square on the left", "green"][i % 3], "n": 1 + i % 2, "seed": 100 + i,
            "guidance_scale": 2.0, **IMAGE_DECODING}


def assert_images_are_direct_calls(answers: list[dict], bodies: list[dict]) -> None:
    pipe = tiny_pipeline()
    for answer, body in zip(answers, bodies, strict=True):
        generators = [torch.Generator().manual_seed(body["seed"] + i) for i in range(body["n"])]
        direct = pipe(body["prompt"], num_images_per_prompt=body["n"], generator=generators, guidance_scale=2.0,
                      output_type="np", **IMAGE_DECODING).images
        served = np.stack([np.asarray(Image.open(io.BytesIO(base64.b64decode(item["b64_json"]))), dtype=np.float64)
                           for item in answer["data"]]) / 255
        assert np.abs(served - direct).max() < 1 / 255  # PNG's rounding only: the same tokens


def test_models_are_listed(service):
    status, raw = client.get(f"http://127.0.0.1:{PORT}/v1/models")
    listed = json.loads(raw)
    assert status == 200 and {m["id"]: m["modality"] for m in listed["data"]} == {v: k for k, v in service.items()}


def test_16_concurrent_image_requests_are_batched_and_each_equals_its_direct_call(service):
    bodies = [image_body(i) for i in range(16)]
    answers = concurrently([lambda body=body: post("/v1/images/generations", body) for body in bodies])
    assert [status for status, _, _ in answers] == [200] * 16
    answers = [answer for _, answer, _ in answers]
    assert max(answer["stats"]["batch_requests"] for answer in answers) > 1  # batches were formed
    assert all(answer["stats"]["batch_rows"] <= 8 for answer in answers)
    assert_images_are_direct_calls(answers, bodies)


def test_8_concurrent_completions_are_batched_and_each_equals_its_direct_call(service):
    bodies = [{"prompt": ["def add(a, b):", "class Stack:"][i % 2], "n": 1 + i % 2, "seed": 7 * i, "max_tokens": 12,
               "temperature": 1.0, "method": "ngram"} for i in range(8)]
    answers = concurrently([lambda body=body: post("/v1/completions", body) for body in bodies])
    assert [status for status, _, _ in answers] == [200] * 8
    assert max(answer["stats"]["batch_requests"] for _, answer, _ in answers) > 1
    pipe = embedded_text_pipeline()
    for (_, answer, _), body in zip(answers, bodies, strict=True):
        direct = pipe([body["prompt"]] * body["n"], decoding="ngram", max_new_tokens=12, temperature=1.0,
                      generator=[torch.Generator().manual_seed(body["seed"] + i) for i in range(body["n"])])
        assert [choice["text"] for choice in answer["choices"]] == direct.texts
        assert answer["object"] == "text_completion" and answer["usage"]["completion_tokens"] > 0


def test_bad_requests_get_one_json_line_and_the_service_keeps_serving(service):
    bodies = [json.dumps(body).encode() for body, _ in BAD_IMAGE_BODIES] + [b"{not json"]
    bodies += [json.dumps({"prompt": "a red circle", "size": "3x3"}).encode()]  # a size this model cannot make
    for raw in bodies:
        started = time.monotonic()
        status, answer, text = post("/v1/images/generations", raw)
        assert 400 <= status < 500, (raw[:80], status)
        assert text.count(b"\n") == 0 and set(answer) == {"error"} and answer["error"]["message"]
        assert time.monotonic() - started < 5  # refused before any model work
    assert post("/v1/completions", {"prompt": "def f(", "model": "no-such-model"})[0] == 404
    status, answer, _ = post("/v1/images/generations", image_body(0))
    assert status == 200 and len(answer["data"]) == 1


def test_a_request_past_its_timeout_is_given_up_and_answered_504(service):
    from mmspec.serving.models import served_model
    from mmspec.serving.service import Limits, build_app, start, stop

    quick = build_app([served_model("pycode/target")], limits=Limits(request_timeout_s=0.5))
    start(quick, port=PORT, name="quick", route_prefix="/quick")
    try:
        status, answer, _ = post("/quick/v1/completions", {"prompt": "def f(", "max_tokens": 200, "method": "ar",
                                                           "temperature": 0.0})
        assert status == 504 and "cancelled" in answer["error"]["message"]
        status, _, _ = post("/quick/v1/completions", {"prompt": "def f(", "max_tokens": 2, "method": "ar"})
        assert status == 200  # the slot was freed: a short request is served after it
    finally:
        stop("quick")


def test_a_replica_killed_under_load_is_restarted_and_every_request_is_answered_once(service):
    bodies = [{"prompt": ["def add(a, b):", "class Stack:"][i % 2], "seed": i, "max_tokens": 120, "temperature": 1.0,
               "method": "model"} for i in range(16)]
    ids = [f"kill-{i}" for i in range(16)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        pending = [pool.submit(post, "/v1/completions", body, request_id)
                   for body, request_id in zip(bodies, ids, strict=True)]
        time.sleep(1.0)  # the first batches are decoding on both replicas (they take seconds)
        replica = next(actor for actor in ray.util.list_named_actors(all_namespaces=True)
                       if f"model-{service['text']}" in actor["name"] and "SERVE_REPLICA" in actor["name"])
        ray.kill(ray.get_actor(replica["name"], namespace=replica["namespace"]), no_restart=True)
        answers = [future.result() for future in pending]
    assert [status for status, _, _ in answers] == [200] * 16
    assert [answer["id"] for _, answer, _ in answers] == ids  # each request id answered, once
    assert max(answer["stats"]["sends"] for _, answer, _ in answers) == 2  # those on the killed replica, sent again
    pipe = embedded_text_pipeline()
    for (_, answer, _), body in zip(answers, bodies, strict=True):  # and answered as if nothing had happened
        direct = pipe(body["prompt"], decoding="model", max_new_tokens=120, temperature=1.0,
                      generator=[torch.Generator().manual_seed(body["seed"])])
        assert answer["choices"][0]["text"] == direct.texts[0]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # Ray Serve brings the deployment back to 2 running replicas
        deployment = serve.status().applications["mmspec"].deployments[f"model-{service['text']}"]
        if deployment.replica_states.get("RUNNING", 0) == 2 and deployment.status == "HEALTHY":
            break
        time.sleep(1)
    assert deployment.replica_states.get("RUNNING", 0) == 2
