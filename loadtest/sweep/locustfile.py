"""The sweep's Locust users: every request a contract request on a real code prompt at the
length being measured, with fixed sampling (:data:`SAMPLING`), so that only the length changes
between runs. Unary over HTTP (tritonclient's binary body), through the OpenAI API or over gRPC;
streaming over gRPC. Standalone with ``locust -f`` too (docs/loadtest.md)."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from functools import lru_cache
from typing import Any, NamedTuple

import grpc.experimental.gevent as grpc_gevent
import tritonclient.http as httpclient
from locust import FastHttpUser, User, constant, events, task

from client.request import CompletionRequest, requested_outputs
from client.transport import Transport
from contract.prompts import code_prompts
from contract.tensors import ENSEMBLE_MODEL
from loadtest.sweep import ITL_NAME, STREAM_NAME

grpc_gevent.init_gevent()  # before any channel exists: grpc calls then yield to other users

# Fixed for the whole sweep: top-k/top-p sampling as a completion service would use; the seed
# is the prompt's index, so the same prompt and length always produce the same completion.
SAMPLING: dict[str, Any] = {"top_k": 40, "top_p": 0.95, "temperature": 0.8}
REQUEST_TIMEOUT_S = 600.0  # a 512-token request at full load takes tens of seconds on 2 cores


class LoadSettings(NamedTuple):
    """Locust's options, or ``LOADTEST_<NAME>`` variables, when run by ``locust -f``."""

    output_len: int = 32  # tokens to generate per request
    prompts: int = 300  # distinct code prompts to cycle through
    prompt_seed: int = 0
    grpc_url: str = "127.0.0.1:8001"  # Triton's gRPC endpoint (gRPC and streaming users)


def load_settings(environment: Any) -> LoadSettings:
    return LoadSettings(*(getattr(environment.parsed_options, f) for f in LoadSettings._fields))


@events.init_command_line_parser.add_listener
def _arguments(parser: Any) -> None:
    for name, default in LoadSettings._field_defaults.items():
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=type(default),
            env_var=f"LOADTEST_{name.upper()}",
            default=default,
        )


@lru_cache(maxsize=8)
def requests_for(settings: LoadSettings) -> tuple[CompletionRequest, ...]:
    """One contract request per prompt, built once per process and length."""
    prompts = code_prompts(settings.prompts, settings.prompt_seed)
    return tuple(
        CompletionRequest(prompt, max_tokens=settings.output_len, seed=i, **SAMPLING)
        for i, prompt in enumerate(prompts)
    )


@lru_cache(maxsize=8)
def http_bodies(settings: LoadSettings) -> tuple[tuple[bytes, dict[str, str]], ...]:
    """tritonclient.http's binary bodies and headers, built once: serialising each request
    would spend the CPU the server needs."""
    outputs, bodies = requested_outputs(httpclient), []
    for request in requests_for(settings):
        body, json_size = httpclient.InferenceServerClient.generate_request_body(
            request.infer_inputs(httpclient), outputs=outputs
        )
        headers = {"Content-Type": "application/octet-stream"}
        if json_size is not None:
            headers["Inference-Header-Content-Length"] = str(json_size)
        bodies.append((body, headers))
    return tuple(bodies)


@lru_cache(maxsize=8)
def openai_bodies(settings: LoadSettings) -> tuple[tuple[bytes, dict[str, str]], ...]:
    """The same requests as ``/v1/completions`` JSON bodies (top_k: the API's extension)."""
    headers = {"Content-Type": "application/json"}
    keys = ("max_tokens", "temperature", "top_p", "top_k", "seed")
    bodies = [
        {"model": ENSEMBLE_MODEL, "prompt": r.prompts[0], **{k: getattr(r, k) for k in keys}}
        for r in requests_for(settings)
    ]
    return tuple((json.dumps(body).encode(), headers) for body in bodies)


def _cycle(user: User, items: tuple) -> Iterator:
    """The requests over and over; users start at different ones, so concurrent requests differ."""
    return itertools.islice(itertools.cycle(items), (id(user) // 16) % max(len(items), 1), None)


class _PostUser(FastHttpUser):
    """Prebuilt bodies posted back to back (a closed loop), reported under the ensemble's name."""

    abstract = True
    wait_time = constant(0)
    network_timeout = REQUEST_TIMEOUT_S
    connection_timeout = 30.0
    path = ""
    bodies = staticmethod(http_bodies)

    def on_start(self) -> None:
        self._bodies = _cycle(self, self.bodies(load_settings(self.environment)))

    @task
    def complete(self) -> None:
        body, headers = next(self._bodies)
        with self.client.post(
            self.path, data=body, headers=headers, name=ENSEMBLE_MODEL, catch_response=True
        ) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {(response.text or '')[:200]}")
                return
            try:
                if problem := self.check(response):
                    response.failure(problem)
            except Exception as exc:
                response.failure(f"unreadable response: {exc}")

    def check(self, response: Any) -> str | None:
        """What is wrong with a 200 answer, or None."""
        raise NotImplementedError


class HttpEnsembleUser(_PostUser):
    path = f"/v2/models/{ENSEMBLE_MODEL}/infer"

    def check(self, response: Any) -> str | None:
        header_length = response.headers.get("Inference-Header-Content-Length")
        result = httpclient.InferenceServerClient.parse_response_body(
            response.content, header_length=int(header_length) if header_length else None
        )
        return "response has no OUTPUT_0" if result.as_numpy("OUTPUT_0") is None else None


class OpenAIUser(_PostUser):
    """Non-streamed ``/v1/completions`` through the OpenAI API in front of the sweep's Triton:
    sent without stop sequences to the unary ``ensemble``, so every Triton figure is the same
    pipeline's and the difference from a gRPC sweep is the API's own overhead."""

    path = "/v1/completions"
    bodies = staticmethod(openai_bodies)

    def check(self, response: Any) -> str | None:
        return "no tokens generated" if response.json()["usage"]["completion_tokens"] < 1 else None


class _TransportUser(User):
    """A user on the client's transport to Triton's gRPC endpoint."""

    abstract = True
    wait_time = constant(0)
    request_type = "grpc"

    def on_start(self) -> None:
        settings = load_settings(self.environment)
        self.transport = Transport(settings.grpc_url, REQUEST_TIMEOUT_S)
        self._requests = _cycle(self, requests_for(settings))

    def on_stop(self) -> None:
        self.transport.close()

    def _fire(self, name: str, seconds: float, error: Exception | None = None, **context: Any):
        self.environment.events.request.fire(
            request_type=self.request_type,
            name=name,
            response_time=seconds * 1000,
            response_length=0,
            exception=error,
            context=context,
        )


class GrpcEnsembleUser(_TransportUser):
    @task
    def complete(self) -> None:
        started, error = time.perf_counter(), None
        try:
            if self.transport.infer(next(self._requests)).as_numpy("OUTPUT_0") is None:
                raise RuntimeError("response has no OUTPUT_0")
        except Exception as exc:
            error = exc
        self._fire(ENSEMBLE_MODEL, time.perf_counter() - started, error)


class StreamingUser(_TransportUser):
    """The decoupled ``ensemble_stream`` over a gRPC stream, kept open from one request to
    the next (as an editor's connection; client/transport.py ``StreamClients``). A request is
    a ``stream`` row with its ``first_token_ms`` and ``tokens`` (pieces); each gap between two
    pieces is a ``stream inter-token`` row."""

    request_type = "grpc-stream"

    @task
    def stream(self) -> None:
        request = next(self._requests)
        started = time.perf_counter()
        first: float | None = None
        last, pieces, error = started, 0, None
        try:
            for piece in self.transport.stream(request).pieces():
                if piece.text:
                    if first is None:
                        first = (piece.arrived - started) * 1000
                    else:
                        self._fire(ITL_NAME, piece.arrived - last)
                    last, pieces = piece.arrived, pieces + 1
        except Exception as exc:
            error = exc
        seconds = time.perf_counter() - started
        self._fire(STREAM_NAME, seconds, error, first_token_ms=first, tokens=pieces)
