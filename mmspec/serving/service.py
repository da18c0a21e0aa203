"""The Ray Serve application of `mmspec serve`: a gateway that answers the HTTP API and one deployment of replicas per
served model.

    POST /v1/images/generations   OpenAI's Images API shape (prompt, n, size, response_format b64_json) + our fields
    POST /v1/completions          OpenAI's Completions API shape (prompt, max_tokens, n, ...) + method and settings
    GET  /v1/models               what is served

The gateway (`Gateway`) checks each request whole (`mmspec.serving.requests`) before any model work, puts the
decoding `"auto"` chose in place of `"auto"` (chosen once per model and sampling, for the largest batch, so a seeded
request's output never depends on which replica or batch serves it), and sends it to its model's deployment
(`ModelServer`). A replica batches the requests that arrive within `batch_wait_ms` (Ray Serve's `@serve.batch`, up to
`max_batch_size` rows) and runs the ones with equal settings as one pipeline call (`mmspec.serving.calls`). A
request past `request_timeout_s` is answered 504 and cancelled: a queued one leaves its batch; a call whose every
request was given up stops at its next step. A replica that dies under a request is restarted by Ray Serve, and the
gateway sends the request again (up to `RETRIES` times): it is answered once, and alike, since it carries its seed.
"""

import asyncio
import base64
import io
import json
import secrets
import threading
import time
import uuid
from dataclasses import dataclass, replace

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError

from mmspec.serving.calls import WARM_UP_PROMPTS, answer_group, auto_decoding, check_request, grouped
from mmspec.serving.models import ServedModel, connect
from mmspec.serving.requests import (
    MAX_BODY_BYTES,
    GenerationRequest,
    RequestError,
    image_request,
    parse_body,
    text_request,
)

RETRIES = 3  # sends of one request, where the replica serving it died


@dataclass(frozen=True)
class Limits:
    """The service's settings a gateway and its replicas share."""

    max_batch_size: int = 8
    batch_wait_ms: float = 20.0
    request_timeout_s: float = 300.0


@dataclass
class Queued:
    """A request in a replica's batch queue, with the wall-clock time past which its caller has given up."""

    request: GenerationRequest
    deadline: float


def png_base64(image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


@serve.deployment(ray_actor_options={"num_cpus": 0})
class ModelServer:
    """A replica of one served model: its pipeline, and a batch queue that runs compatible requests together."""

    def __init__(self, model: ServedModel, limits: Limits):
        self.limits, self.pipe = limits, model.load()
        self.lock = threading.Lock()  # one pipeline call at a time: the batches' and `choose`'s
        self.batched.set_max_batch_size(limits.max_batch_size)
        self.batched.set_batch_wait_timeout_s(limits.batch_wait_ms / 1000)

    async def choose(self, request: GenerationRequest) -> dict:
        """The config of the decoding `"auto"` chooses for `request`'s sampling at this replica's largest batch, or
        the refusal of a request this model cannot serve."""
        try:
            check_request(self.pipe, request)
        except RequestError as error:
            return error.refusal()
        return await asyncio.to_thread(self.run_locked, auto_decoding, self.pipe, request, self.limits.max_batch_size)

    async def generate(self, request: GenerationRequest, deadline: float) -> dict:
        """`request`'s answer (`answer_group`, its images as base64 PNG), or the refusal of one this model cannot
        serve."""
        try:
            check_request(self.pipe, request)
        except RequestError as error:
            return error.refusal()
        return await self.batched(Queued(request, deadline))

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.02,
                 batch_size_fn=lambda queued: sum(item.request.rows for item in queued))
    async def batched(self, queued: list[Queued]) -> list[dict]:
        answers: list[dict] = [{}] * len(queued)
        for group in grouped([item.request for item in queued]):
            last = max(queued[i].deadline for i in group)
            found = await asyncio.to_thread(self.run_locked, self.call, [queued[i].request for i in group],
                                            lambda last=last: time.time() > last)
            for i, answer in zip(group, found, strict=True):
                answers[i] = answer
        return answers

    def run_locked(self, work, *args):
        with self.lock:
            return work(*args)

    def call(self, requests: list[GenerationRequest], stop) -> list[dict]:
        """`answer_group`'s answers, images as base64 PNG; what the model refuses of the shared settings (a negative
        prompt to a family without one) as each request's refusal."""
        try:
            answers = answer_group(self.pipe, requests, stop)
        except (TypeError, ValueError) as error:
            return [RequestError(str(error)).refusal() for _ in requests]
        for answer in answers:
            if requests[0].modality == "image" and "outputs" in answer:
                answer["outputs"] = [png_base64(image) for image in answer["outputs"]]
        return answers


api = FastAPI(title="mmspec", description="Speculative decoding for AR image and text generation, served by Ray.")


def refused(error: RequestError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


async def awaited(response) -> dict:
    """A deployment's response as a coroutine (what `asyncio.wait_for` takes)."""
    return await response


async def read_body(request: Request) -> bytes:
    """The body; RequestError (413) past `MAX_BODY_BYTES`, of which no more is kept (the rest is read and dropped, so
    the connection stays in step)."""
    kept, size = bytearray(), 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= MAX_BODY_BYTES:
            kept += chunk
    if size > MAX_BODY_BYTES:
        raise RequestError(f"the body is {size:,} bytes; at most {MAX_BODY_BYTES:,} are read", status=413)
    return bytes(kept)


def images_answer(answer: dict, request: GenerationRequest) -> dict:
    return {"data": [{"b64_json": image, "seed": seed}
                     for image, seed in zip(answer["outputs"], request.row_seeds(), strict=True)]}


def completions_answer(answer: dict, request: GenerationRequest) -> dict:
    outputs = answer["outputs"]
    choices = [{"index": i, "text": out["text"], "finish_reason": out["finish_reason"], "logprobs": None}
               for i, out in enumerate(outputs)]
    prompt_tokens = sum(out["prompt_tokens"] for out in outputs[:: request.n])
    completion_tokens = sum(out["tokens"] for out in outputs)
    return {"object": "text_completion", "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=4096)
@serve.ingress(api)
class Gateway:
    """The HTTP API: checks requests, resolves "auto", routes each to its model's replicas and answers."""

    def __init__(self, servers: dict, models: dict[str, ServedModel], limits: Limits):
        self.servers, self.models, self.limits = servers, models, limits
        self.chosen: dict[str, dict] = {}  # model and sampling -> the decoding "auto" stands for
        self.choosing: dict[str, asyncio.Lock] = {}

    @api.get("/v1/models")
    def list_models(self) -> dict:
        return {"object": "list", "data": [
            {"id": model.id, "object": "model", "owned_by": "mmspec", "modality": model.modality,
             "auto_chose": [{"sampling": dict(json.loads(key)[1]), "decoding": decoding}
                            for key, decoding in self.chosen.items() if json.loads(key)[0] == model.id]}
            for model in self.models.values()]}

    @api.post("/v1/images/generations")
    async def images(self, request: Request) -> JSONResponse:
        return await self.answer(request, "image")

    @api.post("/v1/completions")
    async def completions(self, request: Request) -> JSONResponse:
        return await self.answer(request, "text")

    async def answer(self, http: Request, modality: str) -> JSONResponse:
        request_id = http.headers.get("x-request-id") or uuid.uuid4().hex
        started = time.time()
        try:
            body = parse_body(await read_body(http))
            parse = image_request if modality == "image" else text_request
            request = parse(body, self.limits.max_batch_size, secrets.randbelow(2**31))
            model = self.model_for(request, modality)
        except RequestError as error:
            return refused(error)
        request = replace(request, model=model.id)
        deadline = started + self.limits.request_timeout_s
        try:
            answer = {}
            if request.decoding == "auto":
                answer = await asyncio.wait_for(self.auto(request), deadline - time.time())
                request = replace(request, decoding=answer)
            if "error" not in answer:
                answer = await self.send(request, deadline)
        except TimeoutError:
            return refused(RequestError(f"not answered within {self.limits.request_timeout_s:g} s (the service's "
                                        "--request-timeout-s); the request was cancelled", status=504))
        if "error" in answer:
            return refused(RequestError(answer["error"], answer.get("param"), answer["status"]))
        shaped = images_answer if modality == "image" else completions_answer
        return JSONResponse({"id": request_id, "created": int(started), "model": model.id, "seed": request.seed,
                             **shaped(answer, request), "stats": answer["stats"]})

    def model_for(self, request: GenerationRequest, modality: str) -> ServedModel:
        """The served model `request` names, or the one model of `modality`; RequestError otherwise."""
        ids = [model.id for model in self.models.values() if model.modality == modality]
        if request.model is None:
            if len(ids) != 1:
                raise RequestError(f"model is missing: this service serves {len(ids)} {modality} models, {ids}",
                                   "model")
            return self.models[ids[0]]
        if request.model not in self.models:
            raise RequestError(f"model {request.model!r} is not served here; the served models are "
                               f"{sorted(self.models)}", "model", 404, "model_not_found")
        model = self.models[request.model]
        if model.modality != modality:
            raise RequestError(f"model {model.id!r} is a {model.modality} model; this endpoint serves {ids}", "model")
        return model

    async def auto(self, request: GenerationRequest) -> dict:
        """The decoding "auto" stands for at `request`'s model and sampling, chosen by one replica on first use (or
        the error of a request the model cannot serve)."""
        key = json.dumps([request.model, sorted(request.sampling.items())], default=str)
        lock = self.choosing.setdefault(key, asyncio.Lock())
        async with lock:
            if key in self.chosen:
                return self.chosen[key]
            chosen = await self.servers[request.model].choose.remote(request)
            if "error" not in chosen:
                self.chosen[key] = chosen
            return chosen

    async def send(self, request: GenerationRequest, deadline: float) -> dict:
        """The answer of `request`'s model, sent again where the replica serving it died (`stats.sends` counts the
        sends); TimeoutError past `deadline`, with the request cancelled."""
        for sends in range(1, RETRIES + 1):
            response = self.servers[request.model].generate.remote(request, deadline)
            try:
                answer = await asyncio.wait_for(awaited(response), max(0.0, deadline - time.time()))
            except TimeoutError:
                response.cancel()
                raise
            except (RayActorError, ActorUnavailableError):
                continue
            if "stats" in answer:
                answer["stats"]["sends"] = sends
            return answer
        return {"error": f"the replicas serving this request died {RETRIES} times under it", "status": 503}

    async def warm_up(self) -> dict:
        """Resolve "auto" for each model at the API's default sampling (what `mmspec serve` waits for before it says
        the service is ready); the choices by model."""
        for model in self.models.values():
            parse = image_request if model.modality == "image" else text_request
            request = replace(parse({"prompt": WARM_UP_PROMPTS[model.modality]}, 1, 0), model=model.id)
            await self.auto(request)
        return self.chosen


def build_app(models: list[ServedModel], replicas: int = 1, limits: Limits = Limits(), gpus_per_replica: float = 0):
    """The Ray Serve application: a gateway and `replicas` replicas of each model (each holding `gpus_per_replica`
    GPUs; 0 on CPUs)."""
    options = {"num_cpus": 0, "num_gpus": gpus_per_replica}
    # a replica takes what its batches can hold and a batch's worth waiting (more wait in the router's queue)
    servers = {model.id: ModelServer.options(name=f"model-{model.id}", num_replicas=replicas, ray_actor_options=options,
                                             max_ongoing_requests=2 * limits.max_batch_size).bind(model, limits)
               for model in models}
    return Gateway.bind(servers, {model.id: model for model in models}, limits)


APP_NAME = "mmspec"


def start(app, host: str = "127.0.0.1", port: int = 8000, address: str | None = None, name: str = APP_NAME,
          route_prefix: str = "/") -> None:
    """Run `app` on Ray Serve at http://host:port/route_prefix (on the Ray cluster at `address`, or a new local one;
    the HTTP address is set by the first application) and return once its replicas are up."""
    connect(address)
    serve.start(http_options={"host": host, "port": port})
    serve.run(app, name=name, route_prefix=route_prefix)


def stop(name: str | None = None, drain: bool = True) -> None:
    """Delete the application `name` (other applications on the cluster keep serving); without one, shut Ray Serve
    and the Ray instance this process joined down. drain=False skips Serve's graceful shutdown (up to 30 s waiting
    for the replicas, longer on a busy machine) for a process that ends next and takes its local instance with it."""
    import ray

    if name is not None:
        serve.delete(name)
        return
    if drain:
        serve.shutdown()
    ray.shutdown()


def warm_up() -> dict:
    """Have the running service choose what "auto" stands for, for each model at the API's default sampling."""
    return serve.get_app_handle(APP_NAME).warm_up.remote().result()
