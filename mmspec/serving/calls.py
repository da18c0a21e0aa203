"""Requests with one `batch_key()` run as one pipeline call, each row on its own generator, and the call's output
split back into each request's answer: what a service replica and an offline worker both do.

Why sharing a call is exact: every image decoding, and every speculative text decoding, draws row b's randomness
from row b's generator alone and accepts each row's tokens on its own, so row b's output is a function of its
prompt, its seed and the call's shared settings, whatever its neighbours are (the tests decode rows alone and in
batches and compare them token for token). Text AR samples with transformers' `generate` on one generator for all its
rows: such a request (at a temperature above 0) is a call of its own (`GenerationRequest.batch_key`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from mmspec.serving.requests import GenerationRequest, RequestError

WARM_UP_PROMPTS = {"image": "a red circle", "text": "def add(a, b):"}  # what "auto" is chosen on


def generators(requests: list[GenerationRequest], device) -> list[torch.Generator] | torch.Generator:
    """Row b's generator, seeded with its request's `seed + i`; one generator for a text AR call (its request's seed
    when it samples, any when it is greedy) and for a call of "auto" (a warm-up, which may choose text AR)."""
    if requests[0].one_generator or requests[0].decoding == "auto":
        return torch.Generator(device).manual_seed(requests[0].seed)
    return [torch.Generator(device).manual_seed(seed) for request in requests for seed in request.row_seeds()]


def call_arguments(requests: list[GenerationRequest], device) -> dict:
    """The keyword arguments of the one pipeline call of `requests` (which share a `batch_key()`)."""
    first = requests[0]
    decoding = first.decoding
    return {"prompt": [prompt for request in requests for prompt in request.row_prompts()],
            "generator": generators(requests, device), "decoding": decoding, **first.settings, **first.sampling}


def check_request(pipe, request: GenerationRequest) -> None:
    """What the model must allow and the request fields cannot tell (the image sizes the model makes, the prompt's
    tokens within the text context), checked without model work; RequestError otherwise."""
    try:
        if request.modality == "image":
            pipe.image_adapter(request.sampling.get("height"), request.sampling.get("width"))
        else:
            pipe.check_lengths(list(request.prompts), request.sampling["max_new_tokens"])
    except (TypeError, ValueError) as error:
        param = "size" if request.modality == "image" else "max_tokens"
        raise RequestError(str(error), param) from None


def answer_group(pipe, requests: list[GenerationRequest], stop: Callable[[], bool] | None = None) -> list[dict]:
    """One pipeline call for `requests`; each request's answer: `outputs` (PIL images, or completions:
    `text`, `finish_reason`, `tokens`), `stats` (the call's figures, `decoding`: the config that ran, `batch_rows`:
    the call's rows, and the request's own rows' new tokens and verification steps) and `seed`. `stop()` is asked
    after every target forward: True ends the call, and every answer is an error (the requests were given up)."""
    arguments = call_arguments(requests, pipe.device)
    if stop is not None:
        def on_step(pipe, step, n_done, tensors):
            pipe._interrupt = pipe._interrupt or stop()
            return tensors

        arguments["callback_on_step_end"] = on_step
    out = pipe(**arguments)
    if pipe.interrupt:
        return [{"error": "given up before its call ended (past its timeout)", "status": 504} for _ in requests]
    call = out.stats.as_dict()
    answers, row = [], 0
    for request in requests:
        rows = slice(row, row + request.rows)
        stats = {"decoding": out.stats.decoding, "batch_requests": len(requests),
                 "batch_rows": len(arguments["prompt"]), "new_tokens": out.stats.new_tokens[rows].tolist(),
                 "verification_steps": out.stats.steps[rows].tolist(), "call": call}
        if request.modality == "image":
            outputs = out.images[rows]
        else:
            limit = request.sampling["max_new_tokens"]
            prompt_tokens = map(len, pipe.tokenizer(request.row_prompts())["input_ids"])
            outputs = [{"text": text, "tokens": tokens, "prompt_tokens": read,
                        "finish_reason": "length" if tokens == limit else "stop"}
                       for text, tokens, read in zip(out.texts[rows], stats["new_tokens"], prompt_tokens, strict=True)]
        answers.append({"outputs": outputs, "stats": stats, "seed": request.seed})
        row += request.rows
    return answers


def auto_decoding(pipe, request: GenerationRequest, rows: int) -> dict:
    """The config of the decoding `decoding="auto"` chooses on `pipe` for `request`'s sampling and a call of `rows`
    rows (measured on first use, cached on disk): one warm-up call of `rows` rows. A service or an offline run puts it
    in place of "auto" for all its calls, so that a seed gives one output whatever call it falls in."""
    warm_up = replace(request, prompts=(WARM_UP_PROMPTS[request.modality],), n=rows, seed=0, decoding="auto",
                      settings={})
    [answer] = answer_group(pipe, [warm_up])
    return answer["stats"]["decoding"]


def grouped(requests: list[GenerationRequest]) -> list[list[int]]:
    """The indices of `requests` by `batch_key()`, in order of first appearance: one pipeline call each."""
    groups: dict[str, list[int]] = {}
    for i, request in enumerate(requests):
        groups.setdefault(request.batch_key(), []).append(i)
    return list(groups.values())
