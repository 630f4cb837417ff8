"""The served path: any OpenAI-compatible completions API, over plain HTTP (httpx).

Only ``/v1/completions`` with ``prompt``, ``suffix``, ``max_tokens``, ``temperature`` 0 and
``stop`` is used (and, for an instruct model, ``/v1/chat/completions`` with ``messages``), so
the same run scores this project's API, llama.cpp's server or vLLM's.
What the server says about itself (``/v1/models``, ``/health``, and Triton's engine settings
when the server is this project's API) goes into the report, best effort.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

DEFAULT_MODEL = "codegen"
RETRIES = 5  # for a 503 (busy or starting): the API says when to retry


class FimUnsupportedError(RuntimeError):
    """The server refused ``suffix``: its model has no fill-in-the-middle tokens."""


@dataclass(frozen=True)
class Request:
    prompt: str
    max_tokens: int
    stops: tuple[str, ...]
    suffix: str | None = None


@dataclass(frozen=True)
class Answer:
    """A completion's text, or why there is none (counted as a failure, listed in the report)."""

    text: str = ""
    error: str | None = None


class CompletionsClient:
    """Greedy completions from ``base_url`` (e.g. ``http://127.0.0.1:8080/v1``)."""

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        timeout: float = 600.0,
        token_healing: bool = True,
    ) -> None:
        """``token_healing`` False: completions send ``token_healing: false`` (this project's
        option); True sends nothing and leaves it to the server (this project heals plain
        completions by default; another server ignores or lacks it)."""
        self.base_url = base_url.rstrip("/")
        self.token_healing = token_healing
        self.http = httpx.Client(timeout=timeout)
        self.model = model or self.first_model() or DEFAULT_MODEL

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> CompletionsClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _get(self, url: str) -> Any:
        try:
            response = self.http.get(url, timeout=10)
            return response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def first_model(self) -> str | None:
        """The first model ``/v1/models`` lists (this API: ``codegen``), if any."""
        listed = self._get(f"{self.base_url}/models")
        try:
            return listed["data"][0]["id"]
        except (KeyError, IndexError, TypeError):
            return None

    def describe(self) -> dict[str, Any]:
        """What the server says about itself: its models, its health and, for this project's
        API, the engine settings Triton loaded (backend, dtype, device)."""
        root = self.base_url.removesuffix("/v1")
        health = self._get(f"{root}/health")
        info: dict[str, Any] = {
            "url": self.base_url,
            "model": self.model,
            "models": self._get(f"{self.base_url}/models"),
            "health": health,
            "engine": None,
        }
        if isinstance(health, dict) and isinstance(health.get("triton"), str):
            info["engine"] = engine_settings(health["triton"])
        return info

    def complete(self, request: Request) -> Answer:
        """One greedy completion; a refusal or a failure becomes an :class:`Answer` with its
        error, except a refused suffix (:class:`FimUnsupportedError`)."""
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": request.prompt,
            "max_tokens": request.max_tokens,
            "temperature": 0,
            "stop": list(request.stops),
        }
        if request.suffix is not None:
            body["suffix"] = request.suffix
        if not self.token_healing:
            body["token_healing"] = False
        response = self._post("/completions", body)
        if isinstance(response, Answer):
            return response
        if response.status_code != 200:
            message = _error_message(response)
            if request.suffix is not None and refuses_suffix(response.status_code, message):
                raise FimUnsupportedError(message)
            return Answer(error=f"HTTP {response.status_code}: {message}")
        try:
            return Answer(text=response.json()["choices"][0]["text"])
        except (ValueError, KeyError, IndexError, TypeError):
            return Answer(error=f"an answer without choices: {response.text[:200]}")

    def chat(self, messages: list[dict[str, str]], max_tokens: int) -> Answer:
        """One greedy chat answer (``/v1/chat/completions``); a failure is the answer's error."""
        if max_tokens < 1:
            return Answer(error="the conversation leaves no room in the model's context")
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens}
        body["temperature"] = 0
        response = self._post("/chat/completions", body)
        if isinstance(response, Answer):
            return response
        if response.status_code != 200:
            return Answer(error=f"HTTP {response.status_code}: {_error_message(response)}")
        try:
            return Answer(text=response.json()["choices"][0]["message"]["content"])
        except (ValueError, KeyError, IndexError, TypeError):
            return Answer(error=f"an answer without choices: {response.text[:200]}")

    def chat_all(
        self,
        conversations: Sequence[list[dict[str, str]]],
        max_tokens: Sequence[int],
        concurrency: int,
        desc: str,
    ) -> list[Answer]:
        """Chat answers in order, ``concurrency`` in flight, with a progress bar."""
        from tqdm import tqdm

        bar = tqdm(total=len(conversations), desc=desc, unit="req", dynamic_ncols=True)

        def one(pair: tuple[list[dict[str, str]], int]) -> Answer:
            answer = self.chat(*pair)
            bar.update(1)
            return answer

        try:
            with ThreadPoolExecutor(max(1, concurrency)) as pool:
                return list(pool.map(one, zip(conversations, max_tokens, strict=True)))
        finally:
            bar.close()

    def _post(self, path: str, body: dict[str, Any]) -> httpx.Response | Answer:
        """POST, retried on a 503 as the API asks; a transport failure is an error answer."""
        for attempt in range(RETRIES):
            try:
                response = self.http.post(f"{self.base_url}{path}", json=body)
            except httpx.HTTPError as exc:
                return Answer(error=f"{type(exc).__name__}: {exc}")
            if response.status_code == 503 and attempt + 1 < RETRIES:
                time.sleep(_retry_after(response))
                continue
            break
        return response

    def complete_all(
        self,
        requests: Sequence[Request],
        concurrency: int,
        progress: Callable[[], None] | None = None,
    ) -> list[Answer]:
        """Answers in order, ``concurrency`` requests in flight (greedy float32 answers do not
        depend on their batch neighbours here; a single-slot server just queues them)."""

        def one(request: Request) -> Answer:
            answer = self.complete(request)
            if progress is not None:
                progress()
            return answer

        with ThreadPoolExecutor(max(1, concurrency)) as pool:
            return list(pool.map(one, requests))


def _retry_after(response: httpx.Response) -> float:
    """The seconds a 503 asks for (1 when it names none or a date), at most 10."""
    try:
        return min(max(float(response.headers.get("retry-after", "1")), 0.1), 10.0)
    except ValueError:
        return 1.0


def _error_message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
        return str(error.get("message") if isinstance(error, dict) else error)
    except (ValueError, AttributeError):
        return response.text[:300]


def refuses_suffix(status: int, message: str) -> bool:
    """Whether an error says the model cannot fill in the middle (this API's 400 names it;
    contract.fim.NO_FIM)."""
    return status == 400 and "fill-in-the-middle" in message.lower()


def engine_settings(triton_grpc: str) -> dict[str, str] | None:
    """The ``engine`` model's parameters (backend, dtype, device, quantize) from the Triton
    behind this project's API, read over gRPC; None where it cannot be reached."""
    try:
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(triton_grpc.split("://")[-1])
        try:
            config = client.get_model_config("engine", as_json=True, client_timeout=10)
        finally:
            client.close()
    except Exception:  # another server, a remote Triton, a missing client: say nothing
        return None
    parameters = config.get("config", {}).get("parameters", {})
    wanted = ("backend", "dtype", "device", "quantize", "prefix_caching")
    return {k: parameters[k]["string_value"] for k in wanted if k in parameters}
