"""The service's requests: a JSON body of `POST /v1/images/generations` or `POST /v1/completions` checked whole and
made into the pipeline call it asks for, before any model work (no torch, no Ray: the gateway runs this).

The bodies follow OpenAI's Images and Completions APIs (`prompt`, `n`, `size`, `response_format`, `max_tokens`, ...)
plus our fields: the decoding (`decoding` for images, `method` for text) with its settings spelled flat as the
pipelines take them (`"decoding": "sjd", "window": 8`, `"acceptance": "lantern", "lantern_delta": 0.2`), `seed`,
`guidance_scale`, `top_k`, `temperature`. A field the API does not know, a value out of its range or of the wrong
type is a `RequestError` naming the field and what is allowed; the service answers it with status 400 and one line
of JSON.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from mmspec.core.component import component_from, rule_settings
from mmspec.core.registry import decodings
from mmspec.core.settings import Spec
from mmspec.image import methods as image_methods  # noqa: F401  the image decodings, registered (no torch)
from mmspec.text import methods as text_methods  # noqa: F401  the text decodings, registered (no torch)

MAX_BODY_BYTES = 64 * 1024  # a longer body is refused unread (413): no prompt a served model reads is near it
MAX_PROMPT_CHARS = 8000
MAX_SEED = 2**63 - 1  # a torch generator's seed (row i's is seed + i)
AUTO = "auto"


class RequestError(ValueError):
    """A request the service refuses, with its HTTP `status`, the request field (`param`) at fault and, where one
    applies, OpenAI's error `code` ("model_not_found")."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.param, self.status, self.code = param, status, code

    def body(self) -> dict:
        """The answer's body, in the shape of OpenAI's errors."""
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param,
                          **({"code": self.code} if self.code else {})}}

    def refusal(self) -> dict:
        """What a replica answers in its place (plain data: it crosses processes)."""
        return {"error": str(self), "status": self.status, "param": self.param}


def parse_body(raw: bytes) -> dict:
    """The JSON object of a request body; `RequestError` for a body too long, not JSON or not an object."""
    if len(raw) > MAX_BODY_BYTES:
        raise RequestError(f"the body is {len(raw):,} bytes; at most {MAX_BODY_BYTES:,} are read", status=413)
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RequestError(f"the body is not JSON ({error})") from None
    if not isinstance(body, dict):
        raise RequestError(f"the body must be a JSON object, got {type(body).__name__}")
    return body


def checked(body: dict, name: str, spec: Spec, default=None):
    """`body[name]` checked by `spec` (`default` when absent); the spec's TypeError / ValueError as a RequestError."""
    if name not in body:
        return default
    try:
        return spec.check(name, body[name])
    except (TypeError, ValueError) as error:
        raise RequestError(str(error), name) from None


def checked_seed(body: dict, spec: Spec, rows: int, default: int) -> int:
    seed = checked(body, "seed", spec, default)
    if seed + rows - 1 > MAX_SEED:
        raise RequestError(f"seed must be at most 2**63 - {rows} (row i draws from seed + i), got {seed}", "seed")
    return seed


def checked_prompt(value, name: str = "prompt") -> str:
    if not isinstance(value, str):
        raise RequestError(f"{name} must be a string, got {type(value).__name__}", name)
    if not value.strip():
        raise RequestError(f"{name} is empty: say what to generate", name)
    if len(value) > MAX_PROMPT_CHARS:
        raise RequestError(f"{name} is {len(value):,} characters long; at most {MAX_PROMPT_CHARS:,} are read", name)
    return value


def decoding_settings(body: dict, modality: str, name: str | dict, known: set[str], argument: str) -> dict:
    """The settings of the decoding `name` given flat in `body` (its own and the rules' flat spellings; none for
    "auto" or a config dict); a field that is neither in `known` nor such a setting is refused."""
    registry = decodings(modality)
    own = set() if isinstance(name, dict) or name == AUTO else {*registry[name].settings(), *rule_settings(modality)}
    unknown = sorted(set(body) - known - own)
    if unknown:
        settings_of = {key for cls in registry.values() for key in cls.settings()} | set(rule_settings(modality))
        if unknown[0] in settings_of:
            takers = [n for n, cls in registry.items() if unknown[0] in cls.settings()]
            of = ("a config, which holds its settings" if isinstance(name, dict) else
                  f"{name!r}" + (" (auto chooses the settings)" if name == AUTO else ""))
            raise RequestError(f"{unknown[0]} is a setting of {argument} {' / '.join(takers) or 'rules'}, not of {of}",
                               unknown[0])
        raise RequestError(f"unknown field {unknown[0]!r}; the fields are {sorted(known)} and the settings of the "
                           f"{argument} named", unknown[0])
    return {key: body[key] for key in own if key in body}


def checked_decoding(body: dict, modality: str, argument: str, known: set[str], temperature: float,
                     names: tuple[str, ...]) -> tuple[str | dict, dict]:
    """(the decoding `body[argument]` names, "auto" by default, or the config dict it gives (an answer's
    `stats.decoding`); its settings given flat), built once to check them."""
    name = body.get(argument, AUTO)
    if isinstance(name, dict):
        settings = decoding_settings(body, modality, name, known, argument)
    elif not isinstance(name, str) or (name != AUTO and name not in decodings(modality)):
        raise RequestError(f"{argument} must be one of {(AUTO, *names)} or a decoding config (an answer's "
                           f"stats.decoding), got {str(name)[:60]!r}", argument)
    else:
        settings = decoding_settings(body, modality, name, known, argument)
    if name != AUTO:
        try:
            component_from(name, modality, argument=argument, **settings).check_sampling(temperature)
        except (TypeError, ValueError) as error:
            message, flat = str(error), rule_settings(modality)
            said = {key: flat[key][1] if key in flat else key for key in settings}  # as the message names it
            param = next((key for key, word in said.items() if re.match(rf"{word}\b", message)), argument)
            if param in flat:
                message = message.replace(said[param], param, 1)
            raise RequestError(message, param) from None
    return name, settings


@dataclass(frozen=True)
class GenerationRequest:
    """What a request asks of a `modality` ("image" or "text") pipeline: `prompts` (`n` rows per prompt, in order), the
    decoding by name and settings (`"auto"` until the service puts its choice, a config dict, in its place), the
    sampling arguments, and `seed`: row i draws from a generator seeded `seed + i`. Requests with equal `batch_key()`
    can share one pipeline call."""

    modality: str
    prompts: tuple[str, ...]
    n: int
    seed: int
    decoding: str | dict
    settings: dict = field(default_factory=dict)
    sampling: dict = field(default_factory=dict)
    model: str | None = None

    @property
    def rows(self) -> int:
        return len(self.prompts) * self.n

    @property
    def decoding_name(self) -> str:
        return self.decoding["name"] if isinstance(self.decoding, dict) else self.decoding

    @property
    def one_generator(self) -> bool:
        """Text AR samples with transformers' `generate`, on one generator for all its rows."""
        return self.modality == "text" and self.decoding_name == "ar"

    def row_prompts(self) -> list[str]:
        return [prompt for prompt in self.prompts for _ in range(self.n)]

    def row_seeds(self) -> list[int]:
        return [self.seed + i for i in range(self.rows)]

    def batch_key(self) -> str:
        """What every row of one pipeline call shares: the model, the decoding and its settings, and the sampling.
        Rows that draw from one generator together (text AR at a temperature above 0) are a call of their own."""
        shared = [self.model, self.modality, self.decoding, sorted(self.settings.items()),
                  sorted(self.sampling.items())]
        if self.one_generator and self.sampling["temperature"] > 0:
            shared.append([self.seed, self.prompts, self.n])
        return json.dumps(shared, sort_keys=True, default=str)


IMAGE_FIELDS = {
    "n": Spec("images of the prompt", int, low=1),
    "seed": Spec("image i draws from a generator seeded seed + i", int, low=0),
    "guidance_scale": Spec("classifier-free guidance (1 = off)", float, low=0),
    "cfg_interval": Spec("image tokens 0 .. N + 1 guided, -1 = all", int, low=-1),
    "temperature": Spec("softmax temperature, 0 = greedy", float, low=0),
    "top_k": Spec("keep the k most likely image tokens, 0 = all", int, low=0),
    "top_p": Spec("nucleus mass, 1 = off", float, low=0, high=1, low_open=True),
    "response_format": Spec("how images come back", str, choices=("b64_json",)),
    "model": Spec("a served model's id", str),
    "size": Spec("WIDTHxHEIGHT in pixels, or auto", str),
    "negative_prompt": Spec("the CFG rows' text (Emu3)", str),
}


def image_request(body: dict, max_images: int, seed: int) -> GenerationRequest:
    """The image generation `body` asks for (`seed` when it names none); RequestError otherwise."""
    known = {"prompt", "decoding", *IMAGE_FIELDS}
    if "prompt" not in body:
        raise RequestError("prompt is missing: say what to draw", "prompt")
    prompt = checked_prompt(body["prompt"])
    n = checked(body, "n", IMAGE_FIELDS["n"], 1)
    if n > max_images:
        raise RequestError(f"n must be <= {max_images} (the service's largest batch), got {n}", "n")
    sampling = {key: checked(body, key, IMAGE_FIELDS[key]) for key in ("guidance_scale", "cfg_interval",
                                                                         "temperature", "top_k", "top_p")}
    sampling = {key: value for key, value in sampling.items() if value is not None}
    checked(body, "response_format", IMAGE_FIELDS["response_format"])
    negative = checked(body, "negative_prompt", IMAGE_FIELDS["negative_prompt"])
    if negative is not None:
        sampling["negative_prompt"] = negative
    size = checked(body, "size", IMAGE_FIELDS["size"], AUTO)
    if size != AUTO:
        match = re.fullmatch(r"([1-9]\d{0,4})x([1-9]\d{0,4})", size)
        if match is None:
            raise RequestError(f"size must be WIDTHxHEIGHT in pixels (e.g. 256x256) or auto, got {size[:40]!r}",
                               "size")
        sampling["width"], sampling["height"] = int(match[1]), int(match[2])
    name, settings = checked_decoding(body, "image", "decoding", known, sampling.get("temperature", 1.0),
                                      tuple(decodings("image")))
    return GenerationRequest("image", (prompt,), n, checked_seed(body, IMAGE_FIELDS["seed"], n, seed), name, settings,
                             sampling, checked(body, "model", IMAGE_FIELDS["model"]))


TEXT_FIELDS = {
    "n": Spec("completions of each prompt", int, low=1),
    "max_tokens": Spec("new tokens per completion at most", int, low=1),
    "seed": Spec("completion i draws from a generator seeded seed + i", int, low=0),
    "temperature": Spec("softmax temperature, 0 = greedy", float, low=0),
    "top_k": Spec("keep the k most likely tokens, 0 = all", int, low=0),
    "top_p": Spec("nucleus mass, 1 = off", float, low=0, high=1, low_open=True),
    "model": Spec("a served model's id", str),
}


def text_request(body: dict, max_rows: int, seed: int) -> GenerationRequest:
    """The completion `body` asks for (`seed` when it names none); RequestError otherwise. As OpenAI's Completions API:
    `prompt` a string or a list of them, `max_tokens` 16 and `temperature` 1 by default."""
    known = {"prompt", "method", *TEXT_FIELDS}
    if "prompt" not in body:
        raise RequestError("prompt is missing: give the text to complete", "prompt")
    given = body["prompt"]
    prompts = [given] if isinstance(given, str) else given
    if not isinstance(prompts, list) or not prompts:
        raise RequestError(f"prompt must be a string or a non-empty list of strings, got {type(given).__name__}",
                           "prompt")
    prompts = tuple(checked_prompt(p) for p in prompts)
    n = checked(body, "n", TEXT_FIELDS["n"], 1)
    if len(prompts) * n > max_rows:
        raise RequestError(f"prompts x n must be <= {max_rows} (the service's largest batch), got "
                           f"{len(prompts)} x {n}", "n")
    sampling = {"max_new_tokens": checked(body, "max_tokens", TEXT_FIELDS["max_tokens"], 16),
                "temperature": checked(body, "temperature", TEXT_FIELDS["temperature"], 1.0),
                "top_k": checked(body, "top_k", TEXT_FIELDS["top_k"], 0),
                "top_p": checked(body, "top_p", TEXT_FIELDS["top_p"], 1.0)}
    name, settings = checked_decoding(body, "text", "method", known, sampling["temperature"],
                                      tuple(decodings("text")))
    return GenerationRequest("text", prompts, n, checked_seed(body, TEXT_FIELDS["seed"], len(prompts) * n, seed),
                             name, settings, sampling,
                             checked(body, "model", TEXT_FIELDS["model"]))
