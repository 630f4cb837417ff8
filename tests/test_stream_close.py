"""How the client library closes a gRPC stream it leaves early, against a fake Triton client:
a stop request first, then the stream closed without a gRPC cancel once both the stream and the
stop request ended. Triton 2.51 can segfault when a cancellation arrives while a request is
completing (triton-inference-server/server#7840), and the stop makes the request complete at
just that moment. A cancel is sent only when the server does not answer the stop in time.

And how the next request reuses the client and, after a clean end, its open stream
(client/transport.py ``StreamClients``)."""

from __future__ import annotations

import threading
import types
from typing import Any, ClassVar

import pytest
import tritonclient.grpc as grpcclient

import client.transport as stream_module
from client import CodegenClient


class _Result:
    def __init__(self, final: bool, text: str | None) -> None:
        self.final, self.text = final, text

    def get_response(self) -> Any:
        flag = types.SimpleNamespace(bool_param=self.final)
        return types.SimpleNamespace(parameters={"triton_final_response": flag})

    def as_numpy(self, name: str) -> Any:
        import numpy as np

        if self.text is None:
            return None
        values = {
            "OUTPUT_0": np.array([[self.text.encode()]], dtype=np.object_),
            "sequence_length": np.array([[4]], dtype=np.uint32),
            "cum_log_probs": np.array([[0.0]], dtype=np.float32),
            "output_log_probs": np.array([[0.0]], dtype=np.float32),
        }
        return values.get(name)  # None for an output the answer lacks, as tritonclient


class _FakeTriton:
    """Answers the stream's request with one piece; a stop request with what the test says."""

    instances: ClassVar[list[_FakeTriton]] = []

    def __init__(self, address: str, ssl: bool = False, answers_stop: bool = True) -> None:
        self.answers_stop = answers_stop
        self.callback: Any = None
        self.cancelled: bool | None = None
        self.requests: list[list[str]] = []
        self.starts = 0  # streams started on this client
        _FakeTriton.instances.append(self)

    def start_stream(self, callback: Any) -> None:
        self.callback = callback
        self.starts += 1
        self.cancelled = None

    def async_stream_infer(self, model: str, inputs: list, **_: Any) -> None:
        names = [tensor.name() for tensor in inputs]
        self.requests.append(names)
        if "stop" not in names:
            self.callback(result=_Result(False, "piece"), error=None)
        elif self.answers_stop:
            # the stream ends with the stop's error, then the stop request's own final flag
            self.callback(result=None, error=RuntimeError("stopped"))
            self.callback(result=_Result(True, None), error=None)

    def stop_stream(self, cancel_requests: bool = False) -> None:
        self.cancelled = cancel_requests

    def close(self) -> None:
        pass


def _codegen(monkeypatch, answers_stop: bool) -> CodegenClient:
    fake = types.SimpleNamespace(
        InferInput=grpcclient.InferInput,
        InferRequestedOutput=grpcclient.InferRequestedOutput,
        InferenceServerClient=lambda address, ssl=False: _FakeTriton(address, ssl, answers_stop),
    )
    codegen = CodegenClient("127.0.0.1:1", "grpc")
    codegen.transport.module = fake  # the stream opens its client through it
    monkeypatch.setattr(stream_module, "STREAM_CLIENTS", stream_module.StreamClients())
    _FakeTriton.instances.clear()
    return codegen


def _whole_answers(monkeypatch) -> None:
    """The fake answers a request with its piece and then its final flag."""
    original = _FakeTriton.async_stream_infer

    def whole_answer(self, model, inputs, **kw):
        original(self, model, inputs, **kw)
        self.callback(result=_Result(True, None), error=None)

    monkeypatch.setattr(_FakeTriton, "async_stream_infer", whole_answer)


def test_a_stream_left_early_is_stopped_then_closed_without_a_cancel(monkeypatch):
    stream = _codegen(monkeypatch, answers_stop=True).stream("def f():", max_tokens=50)
    assert next(stream) == "piece"
    stream.close()
    (fake,) = _FakeTriton.instances
    assert ["stop" in names for names in fake.requests] == [False, True]
    assert fake.cancelled is False


def test_a_stop_the_server_does_not_answer_falls_back_to_a_cancel(monkeypatch):
    monkeypatch.setattr(stream_module, "STOP_WAIT_S", 0.05)
    stream = _codegen(monkeypatch, answers_stop=False).stream("def f():", max_tokens=50)
    assert next(stream) == "piece"
    stream.close()
    (fake,) = _FakeTriton.instances
    assert fake.cancelled is True


@pytest.mark.parametrize("answers_stop", [True, False])
def test_a_stream_read_to_its_end_sends_no_stop_and_stays_open(monkeypatch, answers_stop):
    codegen = _codegen(monkeypatch, answers_stop)
    _whole_answers(monkeypatch)
    assert "".join(codegen.stream("def f():", max_tokens=50)) == "piece"
    (fake,) = _FakeTriton.instances
    assert len(fake.requests) == 1
    assert fake.cancelled is None  # neither closed nor cancelled: kept for the next request


def test_the_next_request_rides_the_open_stream_of_one_that_ended_cleanly(monkeypatch):
    codegen = _codegen(monkeypatch, answers_stop=True)
    _whole_answers(monkeypatch)
    for _ in range(3):
        assert "".join(codegen.stream("def f():", max_tokens=50)) == "piece"
    (fake,) = _FakeTriton.instances  # one client, one channel
    assert len(fake.requests) == 3 and fake.starts == 1


def test_a_stream_left_early_closes_its_stream_but_the_next_reuses_its_client(monkeypatch):
    codegen = _codegen(monkeypatch, answers_stop=True)
    stream = codegen.stream("def f():", max_tokens=50)
    assert next(stream) == "piece"
    stream.close()  # stopped: its stream ends with an error, which names no request
    stream = codegen.stream("def f():", max_tokens=50)
    assert next(stream) == "piece"
    (fake,) = _FakeTriton.instances
    assert fake.starts == 2 and fake.cancelled is None
    stream.close()


def test_a_kept_stream_the_server_ended_is_not_used_again(monkeypatch):
    """A server that restarts ends the kept stream between two requests: its error reaches
    nobody, and the next request starts a fresh stream on the client."""
    codegen = _codegen(monkeypatch, answers_stop=True)
    _whole_answers(monkeypatch)
    assert "".join(codegen.stream("def f():", max_tokens=50)) == "piece"
    (fake,) = _FakeTriton.instances
    fake.callback(result=None, error=RuntimeError("Socket closed"))
    assert "".join(codegen.stream("def f():", max_tokens=50)) == "piece"
    assert fake.starts == 2 and len(fake.requests) == 2


def test_a_kept_stream_that_died_unnoticed_is_replaced_once(monkeypatch):
    """tritonclient refuses a request on a stream it knows is dead before the callback says
    so: the request goes again on a fresh stream."""
    from tritonclient.utils import InferenceServerException

    codegen = _codegen(monkeypatch, answers_stop=True)
    _whole_answers(monkeypatch)
    assert "".join(codegen.stream("def f():", max_tokens=50)) == "piece"
    (fake,) = _FakeTriton.instances
    answering = _FakeTriton.async_stream_infer
    refused_on = []

    def dead_once(self, model, inputs, **kw):
        if self.starts == 1:
            refused_on.append(self.starts)
            raise InferenceServerException("The stream is no longer in valid state")
        answering(self, model, inputs, **kw)

    monkeypatch.setattr(_FakeTriton, "async_stream_infer", dead_once)
    assert "".join(codegen.stream("def f():", max_tokens=50)) == "piece"
    assert refused_on == [1] and fake.starts == 2


def test_a_stream_the_server_refused_sends_no_stop(monkeypatch):
    codegen = _codegen(monkeypatch, answers_stop=True)

    def refused(self, model, inputs, **kw):
        self.requests.append([tensor.name() for tensor in inputs])
        self.callback(result=None, error=RuntimeError("the prompt is too long"))

    monkeypatch.setattr(_FakeTriton, "async_stream_infer", refused)
    with pytest.raises(Exception, match="too long"):
        next(codegen.stream("def f():", max_tokens=50))
    (fake,) = _FakeTriton.instances
    assert len(fake.requests) == 1 and fake.cancelled is False


def test_a_stream_to_a_server_that_is_down_says_so_though_the_reason_comes_late(monkeypatch):
    """tritonclient marks a failed stream invalid, and only then reports the gRPC error through
    the callback: a request sent in between is refused with "no longer in valid state". The
    client waits for the reported reason (here 50 ms late) and raises it: the server is down."""
    from tritonclient.utils import InferenceServerException

    from client.results import ServerUnavailableError

    codegen = _codegen(monkeypatch, answers_stop=True)

    def down(self, model, inputs, **kw):
        unavailable = InferenceServerException("failed to connect", "StatusCode.UNAVAILABLE")
        report = threading.Timer(0.05, self.callback, kwargs={"result": None, "error": unavailable})
        report.start()
        raise InferenceServerException(
            "The stream is no longer in valid state, the error "
            "detail is reported through provided callback."
        )

    monkeypatch.setattr(_FakeTriton, "async_stream_infer", down)
    with pytest.raises(ServerUnavailableError):
        next(codegen.stream("def f():", max_tokens=50))


def test_under_gevent_a_clean_end_closes_the_stream_and_keeps_the_client(monkeypatch):
    """A Locust harness (gevent): an idle open stream would block its greenlets, so each
    request starts a stream of its own on the kept client."""
    monkeypatch.setattr(stream_module, "_under_gevent", lambda: True)
    codegen = _codegen(monkeypatch, answers_stop=True)
    _whole_answers(monkeypatch)
    for _ in range(2):
        assert "".join(codegen.stream("def f():", max_tokens=50)) == "piece"
    (fake,) = _FakeTriton.instances  # one client, one channel
    assert fake.starts == 2 and fake.cancelled is False  # each stream closed, not cancelled
