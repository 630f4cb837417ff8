"""The client's transport over HTTP server-sent events, against a scripted local server: the
OpenAI API's stream read as pieces to its [DONE], a refusal as the API's message with its
``param``, a stream cut short as an error, a reader that waits no longer than it asks and a
request abandoned while the server holds it. (gRPC streams: tests/test_stream_close.py and
the tests against the session's server.)"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator

import pytest

from client.request import gives_account
from client.results import CodegenError, Piece, Target, error_message
from client.transport import ResponseStream, Transport

EVENTS = [
    {"choices": [{"text": "ab"}]},
    {"choices": [{"text": ""}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
]
REFUSAL = {"error": {"message": "suffix is not supported", "param": "suffix"}}
ROUTES = ("hold", "late", "trickle")
left = {route: threading.Event() for route in ROUTES}  # the server saw the client go
arrived = {route: threading.Event() for route in ROUTES}


class _Api(http.server.BaseHTTPRequestHandler):
    """``/done``: the events, then [DONE]; ``/cut``: the events, no [DONE]; ``/refuse``: 400;
    ``/hold``: headers, then nothing until the client leaves; ``/late``: not even headers;
    ``/trickle``: one piece, then nothing until the client leaves."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        route = self.path.split("/")[1]
        if route == "late":
            self._until_the_client_leaves(route)
            return
        if route == "refuse":
            body = json.dumps(REFUSAL).encode()
            self.send_response(400)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        if route in ("hold", "trickle"):
            if route == "trickle":  # one piece, then nothing until the client leaves
                self.wfile.write(b"data: " + json.dumps(EVENTS[0]).encode() + b"\n\n")
            self.wfile.flush()
            self._until_the_client_leaves(route)
            return
        for event in EVENTS:
            self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            self.wfile.flush()
        if route == "done":
            self.wfile.write(b"data: [DONE]\n\n")

    def _until_the_client_leaves(self, route: str) -> None:
        arrived[route].set()
        self.connection.settimeout(120)  # a bound for a loaded machine, not a timing
        if self.rfile.read(1) == b"":  # the client shut its side: it left
            left[route].set()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def api() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _stream(api: str, route: str) -> ResponseStream:
    """A stream to ``route`` (the scripted server reads the path's first part)."""
    return Transport(Target("http", f"{api}/{route}"), timeout=10).openai_stream({"prompt": "x"})


def _read_all(stream: ResponseStream) -> list[Piece]:
    pieces = []
    while not pieces or not pieces[-1].final:
        piece = stream.read(10)
        assert piece is not None, "the scripted server answers at once"
        pieces.append(piece)
    return pieces


def test_an_openai_stream_is_read_as_pieces_to_its_done(api):
    pieces = _read_all(_stream(api, "done"))
    assert [p.text for p in pieces] == ["ab", "", ""] and pieces[-1].final
    assert pieces[1].usage == {"prompt_tokens": 3, "completion_tokens": 2}


def test_a_refusal_is_the_apis_message_with_its_param(api):
    with pytest.raises(CodegenError, match=r"HTTP 400: suffix is not supported \[param: suffix\]"):
        _read_all(_stream(api, "refuse"))
    assert error_message(b'{"error": "too long"}', 400) == "too long"  # Triton's own form


def test_a_stream_cut_before_done_is_an_error(api):
    with pytest.raises(CodegenError, match="before \\[DONE\\]"):
        _read_all(_stream(api, "cut"))


def test_a_reader_waits_no_longer_than_it_asks_and_leaves_at_once(api):
    stream = _stream(api, "hold")
    began = time.monotonic()
    assert stream.read(0.2) is None
    assert time.monotonic() - began < 60.0  # the server holds its answer for 120 s
    stream.abandon()  # while its reader thread is blocked reading: the server sees it go
    assert left["hold"].wait(60.0)


def test_a_stream_left_before_its_answer_began_is_dropped_too(api):
    stream = _stream(api, "late")
    stream.abandon()  # at once: the connection may not even be made yet
    stream.reader.join(60.0)
    assert not stream.reader.is_alive()  # it did not wait for an answer (held for 120 s)
    # the server saw the client go, or never got the request (shut down before it was sent)
    if arrived["late"].wait(1.0):
        assert left["late"].wait(60.0)


def test_a_reader_told_to_leave_at_its_first_piece_leaves_by_itself(api):
    stream = _stream(api, "trickle")
    stream.leave_after = 1
    piece = stream.read(10.0)
    assert piece is not None and piece.text == "ab"
    assert left["trickle"].wait(60.0)  # nobody called abandon(): the reader left on its own


def test_the_engines_account_is_asked_for_only_where_the_ensemble_gives_it(monkeypatch):
    """A FasterTransformer export's ensemble lacks finish_reason and the token counts, and
    Triton refuses a request for an output the model lacks: the transport reads the model's
    metadata once and asks for the account only where it is listed."""
    from types import SimpleNamespace

    from contract.tensors import ENSEMBLE_OUTPUTS, RESULT_OUTPUT_NAMES

    seed = [spec.name for spec in ENSEMBLE_OUTPUTS]
    served = {"ensemble": seed + list(RESULT_OUTPUT_NAMES), "ft": seed}
    asked: list[str] = []

    def metadata(method: str, model: str) -> SimpleNamespace:
        assert method == "get_model_metadata"
        asked.append(model)
        return SimpleNamespace(outputs=[SimpleNamespace(name=name) for name in served[model]])

    transport = Transport("localhost:1", timeout=1.0)
    monkeypatch.setattr(transport, "call", metadata)
    for model in ("ensemble", "ft", "ensemble", "ft"):
        names = [output.name() for output in transport.outputs(model)]
        assert names == served[model], model
    assert asked == ["ensemble", "ft"]  # once per model
    http_metadata = {"outputs": [{"name": name} for name in seed]}
    assert not gives_account(http_metadata)
    http_metadata["outputs"] += [{"name": name} for name in RESULT_OUTPUT_NAMES]
    assert gives_account(http_metadata)
