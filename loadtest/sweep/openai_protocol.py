"""``make loadtest PROTOCOL=openai``: the same sweep through the OpenAI-compatible API.

:class:`OpenAIUser` posts ``/v1/completions`` with the very prompts, output length and sampling
of the other users (built from the same :class:`client.CompletionRequest` objects), and
:class:`loadtest.api_process.ApiProcess` runs the API (``python -m openai_api``) in front of the
sweep's Triton. The API sends non-streamed requests without stop sequences to the unary
``ensemble``, so every Triton figure of the sweep stays the same pipeline's, and the difference
from a gRPC sweep is the API's own overhead (HTTP + JSON + FastAPI + its gRPC client, on the
same cores).
"""

from __future__ import annotations

import itertools
import json
from functools import lru_cache

from locust import FastHttpUser, constant, task

from client import ENSEMBLE_MODEL
from loadtest.sweep.locustfile import REQUEST_TIMEOUT_S, LoadSettings, load_settings, requests_for


@lru_cache(maxsize=8)
def openai_bodies(settings: LoadSettings) -> tuple[bytes, ...]:
    """The JSON bodies, built once (as the HTTP user's are): the contract's requests as
    OpenAI options, with top_k as the API's extension."""
    return tuple(
        json.dumps(
            {
                "model": ENSEMBLE_MODEL,
                "prompt": request.prompts[0],
                "max_tokens": request.max_tokens,
                "temperature": request.temperature,
                "top_p": request.top_p,
                "top_k": request.top_k,
                "seed": request.seed,
            }
        ).encode()
        for request in requests_for(settings)
    )


class OpenAIUser(FastHttpUser):
    """Non-streamed ``POST /v1/completions`` back to back (a closed loop), reported under the
    ensemble's name so that the sweep's live figures and its count check apply unchanged."""

    wait_time = constant(0)
    network_timeout = REQUEST_TIMEOUT_S
    connection_timeout = 30.0

    def on_start(self) -> None:
        bodies = openai_bodies(load_settings(self.environment))
        self._bodies = itertools.islice(
            itertools.cycle(bodies), (id(self) // 16) % len(bodies), None
        )

    @task
    def complete(self) -> None:
        with self.client.post(
            "/v1/completions",
            data=next(self._bodies),
            headers={"Content-Type": "application/json"},
            name=ENSEMBLE_MODEL,
            catch_response=True,
        ) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {(response.text or '')[:200]}")
                return
            try:
                usage = response.json()["usage"]
                if usage["completion_tokens"] < 1:
                    response.failure("no tokens generated")
            except Exception as exc:
                response.failure(f"unreadable response: {exc}")
