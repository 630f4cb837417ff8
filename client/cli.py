"""The ``codegen`` command: complete code with the server, or ask whether it is ready.

    codegen complete "def fib(n):" --max-tokens 64
    codegen complete --stream "def fib(n):"          # print pieces as they are generated
    codegen complete --file script.py >> script.py   # complete at the end of a file
    codegen complete --suffix "    return a" "def f(a):\n"  # fill in the middle
    echo "import numpy as np" | codegen complete --json
    codegen health
    codegen chat "Write fib in Python" --system "Answer with code only."  # client/chat.py

Exit codes: 0 done; 1 the server refused or failed the request (its message is printed), or
is not ready; 2 usage error or an invalid option (refused before anything is sent);
3 no server answers at the URL; 130 interrupted (Ctrl-C). Ctrl-C and --timeout stop the
generation on the server: a stream is cancelled, a unary request is sent a stop request.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from client import chat
from client.client import CodegenClient
from client.request import CompletionRequest
from client.results import (
    DEFAULT_PORTS,
    PROTOCOLS,
    CodegenError,
    Completion,
    Health,
    ServerUnavailableError,
    TimedOutError,
)
from contract.options import DEFAULT_MAX_TOKENS, DEFAULT_SAMPLING, InvalidRequestError
from contract.tensors import ENSEMBLE_MODEL, STREAM_MODEL

EXIT_OK = 0
EXIT_SERVER_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130

URL_ENV = "CODEGEN_URL"
PROTOCOL_ENV = "CODEGEN_PROTOCOL"

# the request's option names (as the contract's messages use them) -> this command's flags
FLAGS = {
    "max_tokens": "--max-tokens",
    "runtime_top_k": "--top-k",
    "runtime_top_p": "--top-p",
    "temperature": "--temperature",
    "repetition_penalty": "--repetition-penalty",
    "random_seed": "--seed",
    "end_id": "--end-id",
    "start_id": "--start-id",
    "beam_width": "--beams",
    "len_penalty": "--len-penalty",
    "beam_search_diversity_rate": "--diversity-rate",
    "single_line": "--single-line",
    "n_indent": "--n-indent",
    "t_max_predict_ms": "--t-max-predict-ms",
    "token_healing": "--no-token-healing",
    "protocol": "--protocol",
    "url": "--url",
}


class UsageError(Exception):
    """A mistake in the command line that argparse cannot see (exit code 2)."""


def _connection_options() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("server")
    group.add_argument(
        "--url",
        help=f"server address, host[:port] or with a scheme (grpc://, http://); default "
        f"${URL_ENV}, else localhost:{DEFAULT_PORTS['grpc']} for gRPC, "
        f"localhost:{DEFAULT_PORTS['http']} for HTTP",
    )
    group.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        help=f"grpc or http; default ${PROTOCOL_ENV}, else the URL's scheme, else grpc",
    )
    group.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds to wait for an answer (or the next streamed piece); default %(default)g",
    )
    return parent


def build_parser() -> argparse.ArgumentParser:
    """The command line: ``complete`` and ``health`` subcommands."""
    parser = argparse.ArgumentParser(
        prog="codegen",
        description="Code completion with the GPT-J model served by Triton.",
        epilog="exit codes: 0 ok, 1 server error or not ready, 2 usage or invalid option, "
        "3 server unreachable, 130 interrupted",
    )
    commands = parser.add_subparsers(dest="command", metavar="{complete,health,chat}")
    server = _connection_options()

    complete = commands.add_parser(
        "complete",
        parents=[server],
        help="complete a prompt",
        description="Complete a prompt (an argument, --file, or standard input) and print the "
        "completion alone.",
    )
    source = complete.add_argument_group("prompt")
    source.add_argument(
        "prompt", nargs="?", help='the code to complete; "-" or absent: read standard input'
    )
    source.add_argument(
        "--file", "-f", metavar="PATH", help="complete at the end of this file (its whole text)"
    )
    source.add_argument(
        "--suffix",
        metavar="TEXT",
        default="",
        help="the text after the cursor: fill in the middle between the prompt and it (the "
        "prompt may then be empty); needs a model trained for it, as the default one is",
    )
    sampling = complete.add_argument_group("generation")
    sampling.add_argument(
        "--max-tokens",
        "-n",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help="tokens to generate at most (%(default)s)",
    )
    sampling.add_argument(
        "--top-k", type=int, default=DEFAULT_SAMPLING.top_k, help="top-k sampling (0: off)"
    )
    sampling.add_argument(
        "--top-p",
        type=float,
        default=DEFAULT_SAMPLING.top_p,
        help="nucleus sampling in [0, 1] (0: off)",
    )
    sampling.add_argument(
        "--temperature",
        type=float,
        default=DEFAULT_SAMPLING.temperature,
        help="sampling temperature (%(default)s)",
    )
    sampling.add_argument(
        "--repetition-penalty",
        type=float,
        default=DEFAULT_SAMPLING.repetition_penalty,
        help="%(default)s: none; > 1 discourages repeats",
    )
    sampling.add_argument("--seed", type=int, help="random seed: same seed, same output")
    sampling.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="WORD",
        help="stop when this text is generated (repeatable)",
    )
    sampling.add_argument(
        "--bad-word",
        action="append",
        default=[],
        metavar="WORD",
        help="never generate this text (repeatable)",
    )
    sampling.add_argument(
        "--log-probs", action="store_true", help="return the log probability of each token"
    )
    sampling.add_argument("--end-id", type=int, help="end-of-text token id (model's own)")
    sampling.add_argument(
        "--single-line", action="store_true", help="end the answer at its first newline"
    )
    for flag, metavar, what in (
        ("--n-indent", "N", "at a later line indented by fewer than N columns (0: off)"),
        ("--t-max-predict-ms", "MS", "after MS milliseconds, once it has a newline (0: off)"),
    ):
        sampling.add_argument(flag, type=int, default=0, metavar=metavar, help=f"end it {what}")
    sampling.add_argument("--start-id", type=int, help="start token id")
    sampling.add_argument(
        "--no-token-healing",
        dest="token_healing",
        action="store_false",
        default=None,
        help="send the prompt's last token as it is (token healing is on by default)",
    )
    beams = complete.add_argument_group("beam search")
    beams.add_argument(
        "--beams",
        type=int,
        default=1,
        metavar="K",
        help="beam search with K beams, all printed best first (1: off; not with --stream)",
    )
    beams.add_argument(
        "--len-penalty",
        type=float,
        help="rank finished beams by log-prob / length**this (0: log-prob alone)",
    )
    beams.add_argument(
        "--diversity-rate",
        type=float,
        help="added x rank to each beam's next-best continuations (< 0 spreads beams out)",
    )
    output = complete.add_argument_group("output")
    output.add_argument(
        "--stream", action="store_true", help="print the completion as it is generated"
    )
    output.add_argument(
        "--json",
        action="store_true",
        help="print the result as JSON (with --stream: one {'piece': ...} line per piece, "
        "then the result)",
    )

    health = commands.add_parser(
        "health",
        parents=[server],
        help="is the server ready, and what does it serve",
        description="Say whether the server is ready and which models it serves.",
    )
    health.add_argument("--json", action="store_true", help="print the health as JSON")
    chat.add_parser(commands)
    return parser


def _connect(args: argparse.Namespace) -> CodegenClient:
    """The client for --url / --protocol, falling back on $CODEGEN_URL / $CODEGEN_PROTOCOL."""
    url = args.url or os.environ.get(URL_ENV) or None
    protocol = args.protocol
    if protocol is None and not (url and "://" in url):
        protocol = os.environ.get(PROTOCOL_ENV) or None
    if not args.timeout > 0:
        raise InvalidRequestError(f"timeout must be > 0 seconds, got {args.timeout}")
    return CodegenClient(url, protocol, timeout=args.timeout)


def _read_prompt(args: argparse.Namespace, stdin: TextIO | None) -> str:
    if args.file is not None:
        if args.prompt is not None:
            raise UsageError("give the prompt as an argument or with --file, not both")
        try:
            with open(args.file, encoding="utf-8") as handle:
                return handle.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read --file {args.file}: {exc}") from exc
    if args.prompt is not None and args.prompt != "-":
        return args.prompt
    if stdin is None or (args.prompt is None and stdin.isatty()):
        raise UsageError(
            'no prompt: give one (codegen complete "def fib(n):"), use --file PATH, '
            "or pipe it on standard input"
        )
    return stdin.read()


# CompletionRequest's fields that the command line names alike, and those it names otherwise
_SAME_NAME = (
    "max_tokens",
    "top_k",
    "top_p",
    "temperature",
    "repetition_penalty",
    "seed",
    "end_id",
    "start_id",
    "len_penalty",
    "suffix",
    "single_line",
    "n_indent",
    "t_max_predict_ms",
    "token_healing",
)
_FLAG_NAME = {
    "return_log_probs": "log_probs",
    "beam_width": "beams",
    "beam_search_diversity_rate": "diversity_rate",
}


def _request(args: argparse.Namespace, prompt: str) -> CompletionRequest:
    options = {name: getattr(args, name) for name in _SAME_NAME}
    options |= {name: getattr(args, flag) for name, flag in _FLAG_NAME.items()}
    stops = {"stop_words": tuple(args.stop), "bad_words": tuple(args.bad_word)}
    return CompletionRequest((prompt,), **options, **stops)


def _print_json(data: Any, out: TextIO) -> None:
    out.write(json.dumps(data, ensure_ascii=False) + "\n")
    out.flush()


def _complete(args: argparse.Namespace, out: TextIO, stdin: TextIO | None) -> int:
    prompt = _read_prompt(args, stdin)
    request = _request(args, prompt)  # refused here, before connecting, if an option is bad
    with _connect(args) as codegen:
        if args.stream:
            with codegen.open_stream(request) as stream:
                for piece in stream:
                    if args.json:
                        _print_json({"piece": piece}, out)
                    else:
                        out.write(piece)
                        out.flush()
            result: Completion | None = stream.completion
        else:
            result = codegen.send(request)[0]
    if result is None:  # pragma: no cover - a finished stream always has its completion
        return EXIT_SERVER_ERROR
    if args.json:
        _print_json(result.to_dict(), out)
    elif result.beams:
        for rank, beam in enumerate(result.beams, 1):
            out.write(f"--- beam {rank}: log-prob {beam.cum_log_prob:.4f}\n{beam.completion}\n")
        out.flush()
    else:
        if not args.stream:
            out.write(result.completion)
        if out.isatty() and not result.completion.endswith("\n"):
            out.write("\n")
        out.flush()
    return EXIT_OK


def _describe(health: Health) -> str:
    state = "ready" if health.serving else "NOT ready"
    lines = [f"{health.url}: Triton {health.server_version or '?'}, {state}"]
    roles = [
        ("completion", ENSEMBLE_MODEL, 'codegen complete "def fib(n):"'),
        ("streaming", STREAM_MODEL, 'codegen complete --stream "def fib(n):"'),
    ]
    for role, model, example in roles:
        status = next((m.state for m in health.models if m.name == model), "absent")
        hint = f"  e.g. {example}" if status == "READY" else ""
        lines.append(f"  {role:<11} {model:<16} {status}{hint}")
    others = [m for m in health.models if m.name not in (ENSEMBLE_MODEL, STREAM_MODEL)]
    if others:
        lines.append("  models: " + ", ".join(f"{m.name} v{m.version} {m.state}" for m in others))
    return "\n".join(lines)


def _health(args: argparse.Namespace, out: TextIO) -> int:
    with _connect(args) as codegen:
        health = codegen.health()
    if args.json:
        _print_json(health.to_dict(), out)
    else:
        out.write(_describe(health) + "\n")
    return EXIT_OK if health.serving else EXIT_SERVER_ERROR


def _name_flag(message: str) -> str:
    """Put the flag next to the contract's option name ("runtime_top_p must be ...")."""
    match = re.match(r"(\w+)", message)
    flag = FLAGS.get(match.group(1)) if match else None
    return f"invalid {flag}: {message}" if flag else message


def main(
    argv: Sequence[str] | None = None,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    stdin: TextIO | None = None,
) -> int:
    """Run the command; returns the exit code (see the module docstring)."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code or 0)
    if args.command is None:
        parser.print_help(err)
        return EXIT_USAGE
    try:
        if args.command == "health":
            return _health(args, out)
        if args.command == "chat":
            return chat.run(args, out, stdin if stdin is not None else sys.stdin)
        return _complete(args, out, stdin if stdin is not None else sys.stdin)
    except (UsageError, InvalidRequestError) as exc:
        err.write(f"codegen: error: {_name_flag(str(exc))}\n")
        return EXIT_USAGE
    except ServerUnavailableError as exc:
        err.write(f"codegen: {exc}\n")
        return EXIT_UNREACHABLE
    except TimedOutError as exc:
        err.write(f"codegen: {exc} (--timeout); the generation was stopped on the server\n")
        return EXIT_SERVER_ERROR
    except CodegenError as exc:
        err.write(f"codegen: the server refused the request: {exc}\n")
        return EXIT_SERVER_ERROR
    except KeyboardInterrupt:
        err.write("\ncodegen: interrupted; the generation was stopped on the server\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `codegen complete --stream ... | head -c 10`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
