"""How the client library closes a gRPC stream it leaves early, against a fake Triton client:
a stop request first, then the stream closed without a gRPC cancel once both the stream and the
stop request ended. Triton 2.51 can segfault when a cancellation arrives while a request is
completing (triton-inference-server/server#7840), and the stop makes the request complete at
just that moment. A cancel is sent only when the server does not answer the stop in time."""

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
        self._channel: Any = None  # what a stream's client shares (client/channel.py)
        _FakeTriton.instances.append(self)

    def __copy__(self) -> _FakeTriton:
        return self  # a stream's client on the transport's channel: here, the fake itself

    def start_stream(self, callback: Any) -> None:
        self.callback = callback

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
    _FakeTriton.instances.clear()
    return codegen


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
def test_a_stream_read_to_its_end_sends_no_stop(monkeypatch, answers_stop):
    codegen = _codegen(monkeypatch, answers_stop)
    original = _FakeTriton.async_stream_infer

    def whole_answer(self, model, inputs, **kw):
        original(self, model, inputs, **kw)
        self.callback(result=_Result(True, None), error=None)

    monkeypatch.setattr(_FakeTriton, "async_stream_infer", whole_answer)
    assert "".join(codegen.stream("def f():", max_tokens=50)) == "piece"
    (fake,) = _FakeTriton.instances
    assert len(fake.requests) == 1 and fake.cancelled is False


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
