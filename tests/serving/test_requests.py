"""The service's requests checked before any model work, and the rule that lets requests share a pipeline call:
each row's output is what the direct pipeline call with its seed gives, whatever its neighbours (no Ray here)."""

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from mmspec.serving.calls import answer_group, auto_decoding, check_request, grouped
from mmspec.serving.models import gpu_share, served_model
from mmspec.serving.requests import MAX_BODY_BYTES, RequestError, image_request, parse_body, text_request
from tests.conftest import embedded_text_pipeline
from tests.models.llamagen_tiny import tiny_pipeline

# the ten kinds of bad request the service must refuse with a 4xx and one JSON line, and the field each names
BAD_IMAGE_BODIES = [
    ({"n": 1}, "prompt"),
    ({"prompt": "a red circle", "n": 0}, "n"),
    ({"prompt": "a red circle", "decoding": "fastest"}, "decoding"),
    ({"prompt": "a red circle", "decoding": "sjd", "window": 0}, "window"),
    ({"prompt": "a red circle", "size": "huge"}, "size"),
    ({"prompt": "a red circle", "colour": "red"}, "colour"),
    ({"prompt": "x" * 1_000_000}, None),  # past the body's limit: 413, unread
    ({"prompt": "a red circle", "seed": -1}, "seed"),
    ({"prompt": "a red circle", "n": "2"}, "n"),
    ({"prompt": "a red circle", "temperature": -0.5}, "temperature"),
]


@pytest.mark.parametrize(("body", "param"), BAD_IMAGE_BODIES)
def test_a_bad_image_request_is_refused_naming_its_field(body, param):
    with pytest.raises(RequestError) as caught:
        image_request(parse_body(json.dumps(body).encode()), max_images=8, seed=0)
    error = caught.value
    assert error.param == param and 400 <= error.status < 500
    line = json.dumps(error.body())
    assert "\n" not in line and len(line) < 1000 and json.loads(line)["error"]["message"] == str(error)


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"\xff\xfe", b""])
def test_a_body_that_is_not_a_json_object_is_refused(raw):
    with pytest.raises(RequestError, match="JSON") as caught:
        parse_body(raw)
    assert caught.value.status == 400


def test_the_body_limit_is_a_413_before_parsing():
    with pytest.raises(RequestError) as caught:
        parse_body(b" " * (MAX_BODY_BYTES + 1))
    assert caught.value.status == 413


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "def f(", "method": "ngram", "window": 4}, "window"),  # a setting of another decoding
    ({"prompt": "def f(", "method": "auto", "draft_length": 4}, "draft_length"),  # auto chooses the settings
    ({"prompt": "def f(", "stream": True}, "stream"),
    ({"prompt": [], "max_tokens": 4}, "prompt"),
    ({"prompt": ["def f(", 3]}, "prompt"),
    ({"prompt": "def f(", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "def f(", "method": "ngram", "acceptance": "typical", "typical_epsilon": 2}, "typical_epsilon"),
    ({"prompt": "def f(", "n": 5}, "n"),  # 5 rows past the batch of 4
])
def test_a_bad_completion_request_is_refused_naming_its_field(body, param):
    with pytest.raises(RequestError) as caught:
        text_request(body, max_rows=4, seed=0)
    assert caught.value.param == param


def test_requests_share_a_call_only_where_that_cannot_change_a_row():
    def text(**fields):
        return text_request({"prompt": "def f(", **fields}, 8, 0)

    one, two = image_request({"prompt": "a", "seed": 1}, 8, 0), image_request({"prompt": "b", "seed": 2}, 8, 0)
    assert one.batch_key() == two.batch_key()  # prompts and seeds are rows' own
    assert one.batch_key() != image_request({"prompt": "a", "top_k": 5}, 8, 0).batch_key()
    assert text(seed=1).batch_key() == text(seed=2).batch_key()
    # text AR samples all its rows from one generator: at a temperature above 0 a request is a call of its own
    sampled = [text(method="ar", seed=seed, temperature=1.0) for seed in (1, 2)]
    assert sampled[0].batch_key() != sampled[1].batch_key() and sampled[0].one_generator
    greedy = [text(method="ar", seed=seed, temperature=0.0) for seed in (1, 2)]
    assert greedy[0].batch_key() == greedy[1].batch_key()
    assert grouped([one, sampled[0], two, sampled[1]]) == [[0, 2], [1], [3]]


@pytest.fixture(scope="module")
def image_pipe():
    return tiny_pipeline()


def direct_images(pipe, request) -> np.ndarray:
    """The direct pipeline call a request stands for: its prompt, n images, generators seeded seed + i."""
    generators = [torch.Generator().manual_seed(seed) for seed in request.row_seeds()]
    out = pipe(request.prompts[0], num_images_per_prompt=request.n, generator=generators, decoding=request.decoding,
               output_type="np", **request.settings, **request.sampling)
    return out.images


@pytest.mark.parametrize("decoding", [{"decoding": "sjd", "window": 3}, {"decoding": "ar"},
                                      {"decoding": "pjd", "window": 2}])
def test_images_in_a_shared_call_equal_their_direct_calls(image_pipe, decoding):
    requests = [image_request({"prompt": prompt, "n": n, "seed": seed, "guidance_scale": 2.0, **decoding}, 8, 0)
                for prompt, n, seed in (("a red circle", 2, 5), ("the blue square", 1, 40), ("green", 3, 5))]
    assert grouped(requests) == [[0, 1, 2]]
    answers = answer_group(image_pipe, requests)
    for request, answer in zip(requests, answers, strict=True):
        shared = np.stack([np.asarray(image, dtype=np.float64) / 255 for image in answer["outputs"]])
        assert np.abs(shared - direct_images(image_pipe, request)).max() < 1 / 255  # PNG's rounding only
        assert answer["stats"]["batch_requests"] == 3 and answer["stats"]["batch_rows"] == 6
        assert answer["stats"]["decoding"]["name"] == decoding["decoding"]


def test_the_decoding_auto_chose_repeats_the_call_bit_for_bit(image_pipe):
    request = image_request({"prompt": "a red circle", "seed": 3}, 8, 0)
    chosen = auto_decoding(image_pipe, request, rows=4)
    assert chosen["name"] in ("ar", "sjd", "heads") and json.loads(json.dumps(chosen)) == chosen
    [first] = answer_group(image_pipe, [replace(request, decoding=chosen)])
    # an answer's stats.decoding, sent back as the request's decoding, repeats it
    again = image_request({"prompt": "a red circle", "seed": 3, "decoding": first["stats"]["decoding"]}, 8, 0)
    assert again.decoding == chosen and again.settings == {}
    [second] = answer_group(image_pipe, [again])
    assert all(a == b for a, b in zip(first["outputs"], second["outputs"], strict=True))
    with pytest.raises(RequestError, match="window must be >= 1") as caught:
        image_request({"prompt": "a red circle", "decoding": {"name": "sjd", "window": 0}}, 8, 0)
    assert caught.value.param == "decoding"
    with pytest.raises(RequestError, match="window is a setting of") as caught:  # settings go inside the config
        image_request({"prompt": "a red circle", "decoding": {"name": "sjd"}, "window": 8}, 8, 0)


def test_a_call_given_up_stops_and_answers_each_request_with_504(image_pipe):
    requests = [image_request({"prompt": "a red circle", "seed": seed, "decoding": "ar"}, 8, 0) for seed in (1, 2)]
    steps = []

    def stop() -> bool:
        steps.append(1)
        return len(steps) >= 2

    answers = answer_group(image_pipe, requests, stop=stop)
    assert answers == [{"error": "given up before its call ended (past its timeout)", "status": 504}] * 2
    assert len(steps) == 2  # stopped at the step after the one that gave up, not run to the end (16 tokens)


def test_a_size_the_model_cannot_make_is_a_request_error(image_pipe):
    with pytest.raises(RequestError, match="cannot generate a 3x3") as caught:
        check_request(image_pipe, image_request({"prompt": "a red circle", "size": "3x3"}, 8, 0))
    assert caught.value.param == "size"


def test_completions_in_a_shared_call_equal_their_direct_calls():
    pipe = embedded_text_pipeline()
    requests = [text_request({"prompt": prompt, "n": n, "seed": seed, "method": "ngram", "max_tokens": 10,
                              "temperature": 1.0}, 8, 0)
                for prompt, n, seed in (("def add(a, b):", 2, 7), ("class Stack:", 1, 7))]
    answers = answer_group(pipe, requests)
    for request, answer in zip(requests, answers, strict=True):
        direct = pipe(request.row_prompts(), decoding="ngram", max_new_tokens=10, temperature=1.0,
                      generator=[torch.Generator().manual_seed(seed) for seed in request.row_seeds()])
        assert [out["text"] for out in answer["outputs"]] == direct.texts
        assert all(out["finish_reason"] in ("length", "stop") and out["prompt_tokens"] > 0
                   for out in answer["outputs"])
    with pytest.raises(RequestError, match="context") as caught:
        check_request(pipe, text_request({"prompt": "def f(", "max_tokens": 100_000}, 8, 0))
    assert caught.value.param == "max_tokens"


def test_served_models_are_told_from_their_folders_and_replicas_share_the_gpus_there_are():
    image, text = served_model("shapes"), served_model("pycode/target")
    assert (image.id, image.modality, image.draft) == ("shapes", "image", None)
    assert (text.id, text.modality) == ("pycode-target", "text") and text.draft.endswith("pycode/draft")
    with pytest.raises(ValueError, match="--draft applies to a text model"):
        served_model("shapes", draft="pycode/draft")
    assert [gpu_share(replicas, 8.0) for replicas in (1, 8, 16)] == [1.0, 1.0, 0.5]
    assert gpu_share(2, 1.0) == 0.5 and gpu_share(3, 0.0) == 0.0
