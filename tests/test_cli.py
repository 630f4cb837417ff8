"""The `codegen` command end to end: a subprocess against the test session's server."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from engine_hold import engine_held

from client import CodegenClient, CompletionRequest
from client.cli import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SERVER_ERROR,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    main,
)

PROMPT = "def fib(n):\n"
CODEGEN = shutil.which("codegen", path=str(Path(sys.executable).parent))


def codegen(*args: str, stdin: str | None = "", env: dict | None = None):
    """Run the installed console script (or the module, where it is not installed)."""
    command = [CODEGEN] if CODEGEN else [sys.executable, "-m", "client.cli"]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CODEGEN_")}
    environment.update(env or {})
    return subprocess.run(
        [*command, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
    )


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def expected(server) -> str:
    """The greedy completion of PROMPT (16 tokens) from the library."""
    return CodegenClient(server.grpc_url).complete(PROMPT, 16).completion


def test_complete_prints_the_completion(server, expected):
    run = codegen("complete", PROMPT, "--max-tokens", "16", "--url", server.grpc_url)
    assert run.returncode == EXIT_OK, run.stderr
    assert run.stdout == expected


def test_complete_over_http_with_the_protocol_flag(server, expected):
    run = codegen("complete", PROMPT, "-n", "16", "--url", server.http_url, "--protocol", "http")
    assert run.returncode == EXIT_OK, run.stderr
    assert run.stdout == expected


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_stream_prints_the_same_text(server, expected, protocol):
    url = f"{protocol}://" + (server.grpc_url if protocol == "grpc" else server.http_url)
    run = codegen("complete", "--stream", PROMPT, "-n", "16", "--url", url)
    assert run.returncode == EXIT_OK, run.stderr
    assert run.stdout == expected


@pytest.mark.parametrize("stream", [[], ["--stream"]])
def test_suffix_fills_in_the_middle(server, stream):
    request = CompletionRequest("def f(a):\n", 12, suffix="    return a\n")
    middle = CodegenClient(server.grpc_url).send(request)[0].completion
    run = codegen(
        "complete",
        "def f(a):\n",
        *stream,
        "-n",
        "12",
        "--suffix",
        "    return a\n",
        "--url",
        server.grpc_url,
    )
    assert run.returncode == EXIT_OK, run.stderr
    assert run.stdout == middle


def test_file_is_completed_at_its_end(server, tmp_path):
    source = tmp_path / "script.py"
    source.write_text("import os\n\n\ndef main():\n    ", encoding="utf-8")
    run = codegen("complete", "--file", str(source), "-n", "12", "--url", server.grpc_url)
    assert run.returncode == EXIT_OK, run.stderr
    library = CodegenClient(server.grpc_url).complete(source.read_text(), 12)
    assert run.stdout == library.completion


@pytest.mark.parametrize("argument", [[], ["-"]])
def test_prompt_from_stdin(server, expected, argument):
    run = codegen("complete", *argument, "-n", "16", "--url", server.grpc_url, stdin=PROMPT)
    assert run.returncode == EXIT_OK, run.stderr
    assert run.stdout == expected


def test_json_result(server, expected):
    run = codegen("complete", PROMPT, "-n", "16", "--json", "--log-probs", "--url", server.grpc_url)
    assert run.returncode == EXIT_OK, run.stderr
    result = json.loads(run.stdout)
    assert result["prompt"] == PROMPT
    assert result["completion"] == expected
    assert result["text"] == PROMPT + expected
    assert result["total_tokens"] > 16
    assert len(result["log_probs"]) == 16
    assert result["cum_log_prob"] == pytest.approx(sum(result["log_probs"]), rel=1e-4)
    assert result["latency_s"] > 0


def test_stream_json_is_one_line_per_piece_then_the_result(server, expected):
    run = codegen("complete", "--stream", "--json", PROMPT, "-n", "16", "--url", server.grpc_url)
    assert run.returncode == EXIT_OK, run.stderr
    lines = [json.loads(line) for line in run.stdout.splitlines()]
    *pieces, result = lines
    assert "".join(p["piece"] for p in pieces) == expected == result["completion"]
    assert result["completion_tokens"] == 16
    assert result["prompt_tokens"] + 16 == result["total_tokens"]


def test_sampling_options_and_environment(server):
    options = ["-n", "12", "--top-k", "20", "--temperature", "1.5", "--seed", "5"]
    options += ["--stop", "\n\n", "--bad-word", "print", "--repetition-penalty", "1.1"]
    env = {"CODEGEN_URL": server.http_url, "CODEGEN_PROTOCOL": "http"}
    run = codegen("complete", PROMPT, *options, "--json", env=env)
    assert run.returncode == EXIT_OK, run.stderr
    library = CodegenClient(server.grpc_url).complete(
        PROMPT,
        12,
        top_k=20,
        temperature=1.5,
        seed=5,
        stop_words=["\n\n"],
        bad_words=["print"],
        repetition_penalty=1.1,
    )
    assert json.loads(run.stdout)["completion"] == library.completion


def test_health(server):
    run = codegen("health", "--url", server.grpc_url)
    assert run.returncode == EXIT_OK, run.stderr
    assert f"grpc://{server.grpc_url}" in run.stdout
    assert "ready" in run.stdout and "ensemble_stream" in run.stdout
    run = codegen("health", "--json", "--url", f"http://{server.http_url}")
    assert run.returncode == EXIT_OK, run.stderr
    health = json.loads(run.stdout)
    assert health["serving"] and health["streaming"]
    assert "gptj" in {m["name"] for m in health["models"]}


# -- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (["--max-tokens", "-5"], "invalid --max-tokens: max_tokens must be a positive integer"),
        (["--top-p", "1.5"], "invalid --top-p: runtime_top_p must be in [0, 1], got 1.5"),
        (["--temperature", "-1"], "invalid --temperature: temperature must be >= 0"),
        (["--top-k", "-2"], "invalid --top-k: runtime_top_k must be >= 0"),
        (["--seed", "-1"], "invalid --seed: random_seed must be in"),
        (["--protocol", "rest"], "invalid choice: 'rest'"),
        (["--max-tokens", "many"], "invalid int value: 'many'"),
    ],
)
def test_invalid_options_are_refused_before_sending(options, words):
    """Nothing listens at the URL: exit code 2 and the option's name, not "unreachable"."""
    run = codegen("complete", PROMPT, *options, "--url", f"localhost:{closed_port()}")
    assert run.returncode == EXIT_USAGE
    assert words in run.stderr
    assert run.stdout == ""


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize(
    "command", [["complete", PROMPT], ["complete", "--stream", PROMPT], ["health"]]
)
def test_server_not_running(command, protocol):
    port = closed_port()
    run = codegen(*command, "--url", f"localhost:{port}", "--protocol", protocol)
    assert run.returncode == EXIT_UNREACHABLE
    assert f"{protocol}://localhost:{port}" in run.stderr
    assert "make triton" in run.stderr


def test_url_from_the_environment_and_the_defaults_in_help():
    port = closed_port()
    run = codegen("complete", PROMPT, env={"CODEGEN_URL": f"localhost:{port}"})
    assert run.returncode == EXIT_UNREACHABLE
    assert f"grpc://localhost:{port}" in run.stderr
    help_text = codegen("complete", "--help").stdout
    assert "localhost:8001" in help_text and "localhost:8000" in help_text


@pytest.mark.parametrize("stream", [[], ["--stream"]])
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_server_error_shows_the_servers_message(server, stream, protocol):
    url = server.grpc_url if protocol == "grpc" else server.http_url
    run = codegen("complete", *stream, PROMPT, "-n", "100000", "--url", url, "--protocol", protocol)
    assert run.returncode == EXIT_SERVER_ERROR
    assert "exceeds the model's context of 512 tokens" in run.stderr


def test_prompt_errors(tmp_path):
    url = ["--url", f"localhost:{closed_port()}"]
    run = codegen("complete", *url, stdin="")
    assert run.returncode == EXIT_USAGE and "empty" in run.stderr
    run = codegen("complete", "--file", str(tmp_path / "missing.py"), *url)
    assert run.returncode == EXIT_USAGE and "cannot read --file" in run.stderr
    (tmp_path / "a.py").write_text("x = 1\n")
    run = codegen("complete", "x", "--file", str(tmp_path / "a.py"), *url)
    assert run.returncode == EXIT_USAGE and "not both" in run.stderr
    assert codegen().returncode == EXIT_USAGE


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_ctrl_c_stops_a_stream(server, protocol):
    url = server.grpc_url if protocol == "grpc" else server.http_url
    command = [CODEGEN] if CODEGEN else [sys.executable, "-m", "client.cli"]
    args = ["complete", "--stream", PROMPT, "-n", "400", "--url", url, "--protocol", protocol]
    # the engine holds after a few steps: the stream is still going when Ctrl-C comes
    with engine_held(server, after_steps=4):
        process = subprocess.Popen(
            [*command, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            # a shell without job control starts background children with SIGINT ignored
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        assert process.stdout is not None
        assert process.stdout.read(1)  # it has started streaming
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    assert process.returncode == EXIT_INTERRUPTED
    assert b"interrupted" in err


def test_main_returns_exit_codes_in_process():
    """``main`` never raises SystemExit (callers embed it); a tty without a prompt is a usage
    error."""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    err = io.StringIO()
    assert main(["complete"], stdin=Terminal(), stderr=err) == EXIT_USAGE
    assert "no prompt" in err.getvalue()
    assert main(["--help"], stdout=io.StringIO()) == EXIT_OK
