"""``codegen chat``: ask the served instruct model a question, the answer streamed to the terminal.

    codegen chat "Write a function that reverses a string"
    echo "Explain this: $(cat setup.py)" | codegen chat --system "Answer briefly."

A chat prompt is the checkpoint's own chat template, which the OpenAI-compatible API renders
(``make api``; docs/api.md), so this command talks to that API's ``/v1/chat/completions`` over
HTTP (the standard library only), not to Triton. Leaving (Ctrl-C) closes the connection, and the
API stops the generation.
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any, TextIO

from client.results import CodegenError, ServerUnavailableError
from contract.options import InvalidRequestError

API_URL_ENV = "CODEGEN_API_URL"
API_KEY_ENV = "CODEGEN_API_KEY"
DEFAULT_API_URL = "http://127.0.0.1:8080"


class ApiUnavailableError(ServerUnavailableError):
    """No OpenAI-compatible API answers at the URL (exit code 3, as for Triton)."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(url, reason)
        self.args = (
            f"no OpenAI-compatible API answers at {url} ({self.reason}); start it with "
            "`make api` (port 8080) or point --api-url at yours",
        )

    def __str__(self) -> str:
        return self.args[0]


def add_parser(commands: Any) -> None:
    """The ``chat`` subcommand on ``codegen``'s subparsers."""
    chat = commands.add_parser(
        "chat",
        help="ask the served instruct model (through the OpenAI API's chat template)",
        description="Send one message (an argument, or standard input) to the OpenAI-compatible "
        "API's /v1/chat/completions and print the answer as it is generated.",
    )
    chat.add_argument("message", nargs="?", help='what to ask; "-" or absent: standard input')
    chat.add_argument("--system", metavar="TEXT", help="a system message before it")
    chat.add_argument(
        "--api-url",
        help=f"the API's base URL; default ${API_URL_ENV}, else {DEFAULT_API_URL} (make api)",
    )
    chat.add_argument("--max-tokens", type=int, help="default: up to the end of the context")
    chat.add_argument("--temperature", type=float, default=0.2, help="default %(default)g")
    chat.add_argument("--top-p", type=float, help="nucleus sampling (default: off)")
    chat.add_argument("--seed", type=int, help="for a repeatable answer when sampling")
    chat.add_argument("--stop", action="append", default=[], help="a stop sequence (repeatable)")
    chat.add_argument("--timeout", type=float, default=600.0, help="seconds; default %(default)g")


def _message(args: argparse.Namespace, stdin: TextIO | None) -> str:
    if args.message is not None and args.message != "-":
        return args.message
    if stdin is None or (args.message is None and stdin.isatty()):
        raise InvalidRequestError(
            'no message: give one (codegen chat "Write fib in Python") or pipe it on standard input'
        )
    return stdin.read()


def body(args: argparse.Namespace, message: str) -> dict[str, Any]:
    """The chat request the command sends (streamed, with its usage)."""
    if not message.strip():
        raise InvalidRequestError("the message is empty: say something")
    messages = [{"role": "system", "content": args.system}] if args.system else []
    messages.append({"role": "user", "content": message})
    request: dict[str, Any] = {
        "model": "codegen",
        "messages": messages,
        "temperature": args.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    options = {"max_tokens": args.max_tokens, "top_p": args.top_p, "seed": args.seed}
    request.update({k: v for k, v in options.items() if v is not None})
    if args.stop:
        request["stop"] = list(args.stop)
    return request


def _events(response: Any) -> Iterator[dict[str, Any]]:
    """The JSON of each server-sent event until ``[DONE]``."""
    for raw in response:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        if data == "[DONE]":
            return
        event = json.loads(data)
        if "error" in event:
            raise CodegenError(event["error"].get("message", str(event["error"])))
        yield event


def run(args: argparse.Namespace, out: TextIO, stdin: TextIO | None) -> int:
    """Send the message and print the answer as it comes; 0 when it finished."""
    request = body(args, _message(args, stdin))
    base = (args.api_url or os.environ.get(API_URL_ENV) or DEFAULT_API_URL).rstrip("/")
    url = base if base.endswith("/v1") else base + "/v1"
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    key = os.environ.get(API_KEY_ENV)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    http = urllib.request.Request(
        url + "/chat/completions", json.dumps(request).encode(), headers, method="POST"
    )
    try:
        response = urllib.request.urlopen(http, timeout=args.timeout)
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = str(exc)
        raise CodegenError(f"HTTP {exc.code}: {message}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ApiUnavailableError(url, str(exc)) from None
    ended_with_newline = True
    with response:
        for event in _events(response):
            for choice in event.get("choices", []):
                text = choice.get("delta", {}).get("content")
                if text:
                    out.write(text)
                    out.flush()
                    ended_with_newline = text.endswith("\n")
    if not ended_with_newline and out.isatty():
        out.write("\n")
    out.flush()
    return 0
