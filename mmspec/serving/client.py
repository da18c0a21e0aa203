"""A minimal client of the service (standard library only): what the benchmark and the tests send. Any HTTP client
works, `openai`'s too (docs/serving.md)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


def post(url: str, body: dict | bytes, request_id: str | None = None, timeout: float = 300) -> tuple[int, bytes]:
    """(status, raw body) of a POST of `body` (a dict sent as JSON, or bytes as they are) to `url`; `request_id` goes
    in the `X-Request-Id` header, which the answer's `id` repeats."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json", **({"x-request-id": request_id} if request_id else {})}
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def get(url: str, timeout: float = 30) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, response.read()
