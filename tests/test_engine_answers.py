"""The engine's answers thread (backend/engine_answers.py) without a server: a stream's tokens
go out in order, those that wait are sent together, and the engine's thread waits after a step
while a stream is ``stream_run_ahead`` tokens ahead of its hand-over. The sender here blocks
until the test lets it go, so every wait below is true by construction."""

from __future__ import annotations

import importlib
import sys
import threading
import types

import numpy as np
import pytest

from engine.interface import GenerationRequest, GenerationResult

FINAL = 1


class _Response:
    def __init__(self, tensors=(), error=None) -> None:
        self.tensors = {t.name: t.value for t in tensors}
        self.error = error


class _Tensor:
    def __init__(self, name: str, value: np.ndarray) -> None:
        self.name, self.value = name, value


@pytest.fixture
def answers(monkeypatch):
    """backend.engine_answers imported against a stand-in for python_backend's utilities,
    which only a Triton stub provides; removed again afterwards."""
    fake = types.ModuleType("triton_python_backend_utils")
    fake.TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL
    fake.InferenceResponse = _Response
    fake.Tensor = _Tensor
    fake.TritonError = str
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    for name in ("backend.io", "backend.engine_answers"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    module = importlib.import_module("backend.engine_answers")
    yield module
    for name in ("backend.io", "backend.engine_answers"):
        sys.modules.pop(name, None)


class GatedSender:
    """Sends only while the gate is open; records what it sent."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.sent: list[tuple[str, int]] = []
        self.waiting = threading.Event()  # a send is blocked at the gate

    def send(self, response=None, flags: int = 0) -> None:
        self.waiting.set()
        assert self.gate.wait(60), "the test never opened the gate"
        tensors = {} if response is None else response.tensors
        piece = tensors["OUTPUT_0"].reshape(-1)[0].decode()
        if flags == FINAL:  # the end carries the engine's account
            assert tensors["finish_reason"].reshape(-1).tolist() == [b"length"], tensors
        self.sent.append((piece, flags))

    def is_cancelled(self) -> bool:
        return False


class Handle:
    def cancel(self) -> None:
        raise AssertionError("nothing here cancels")


class Decoder:
    """Each token's text is its id in brackets (the real one never splits a character)."""

    def push(self, token: int) -> str:
        return f"<{token}>"

    def flush(self) -> str:
        return ""


def _stream(answers, deliveries, sender):
    request = GenerationRequest([1, 2, 3], 8)
    stream = answers.TextStream(sender, request, Decoder(), lambda: None, deliveries)
    stream.handle = Handle()
    return stream


def _done(tokens: list[int]) -> GenerationResult:
    return GenerationResult([1, 2, 3], tokens, [0.0] * len(tokens), "length")


def _keep_up_in_thread(deliveries) -> threading.Thread:
    thread = threading.Thread(target=deliveries.keep_up, daemon=True)
    thread.start()
    return thread


def test_run_ahead_1_waits_after_a_step_until_its_token_is_handed_over(answers):
    deliveries = answers.Deliveries(run_ahead=1)
    sender = GatedSender()
    stream = _stream(answers, deliveries, sender)
    stream.on_token(10, 0.0)  # the step's token: its send now waits at the gate
    assert sender.waiting.wait(60)
    step = _keep_up_in_thread(deliveries)
    step.join(0.2)
    assert step.is_alive(), "the engine stepped on with its token not handed over"
    sender.gate.set()
    step.join(60)
    assert not step.is_alive()
    stream.on_finish(_done([10]))
    deliveries.stop()
    assert sender.sent == [("<10>", 0), ("", FINAL)]


def test_run_ahead_2_lets_one_step_overlap_the_send_and_coalesces_what_waits(answers):
    deliveries = answers.Deliveries(run_ahead=2)
    sender = GatedSender()
    stream = _stream(answers, deliveries, sender)
    stream.on_token(10, 0.0)
    assert sender.waiting.wait(60)  # token 10's send is blocked
    first = _keep_up_in_thread(deliveries)
    first.join(60)
    assert not first.is_alive(), "one token ahead is within run_ahead 2"
    stream.on_token(11, 0.0)  # two not handed over: the next step waits
    stream.on_token(12, 0.0)
    second = _keep_up_in_thread(deliveries)
    second.join(0.2)
    assert second.is_alive()
    sender.gate.set()
    second.join(60)
    assert not second.is_alive()
    stream.on_finish(_done([10, 11, 12]))
    deliveries.stop()
    # 11 and 12 waited together behind 10's send: one response
    assert sender.sent == [("<10>", 0), ("<11><12>", 0), ("", FINAL)]


def test_a_finished_stream_never_holds_the_engine(answers):
    deliveries = answers.Deliveries(run_ahead=1)
    sender = GatedSender()
    sender.gate.set()
    stream = _stream(answers, deliveries, sender)
    stream.on_token(10, 0.0)
    stream.on_finish(_done([10]))
    deliveries.stop()
    step = _keep_up_in_thread(deliveries)
    step.join(60)
    assert not step.is_alive()
    with pytest.raises(ValueError, match="stream_run_ahead must be at least 1"):
        answers.Deliveries(run_ahead=0)


class RecordingSender:
    """Records every response: its text, flags and account."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int, dict]] = []

    def send(self, response=None, flags: int = 0) -> None:
        tensors = {} if response is None else response.tensors
        assert response is not None and response.error is None, "an error was sent"
        piece = tensors["OUTPUT_0"].reshape(-1)[0].decode()
        account = {
            name: tensors[name].reshape(-1).tolist()
            for name in ("finish_reason", "completion_tokens")
            if name in tensors
        }
        self.sent.append((piece, flags, account))

    def is_cancelled(self) -> bool:
        return False


class CancelledHandle:
    def __init__(self) -> None:
        self.cancelled = 0

    def cancel(self) -> None:
        self.cancelled += 1


def test_a_stop_word_in_the_text_ends_the_stream_at_its_token_and_drops_the_row(answers):
    """ "2><3" is no token's text: it spans tokens 2 and 3. The stream ends with token 3's
    text, says stop_word with 3 tokens, and the row is dropped; what the engine generated past
    it and the row's own (cancelled) end are never sent."""
    deliveries = answers.Deliveries(run_ahead=8)
    sender = RecordingSender()
    request = GenerationRequest([1, 2, 3], 8)
    stream = answers.TextStream(
        sender, request, Decoder(), lambda: None, deliveries, stop_words=("2><3",)
    )
    stream.handle = handle = CancelledHandle()
    for token in (1, 2, 3, 4):
        stream.on_token(token, 0.0)
    stream.on_finish(GenerationResult([1, 2, 3], [1, 2, 3, 4], [0.0] * 4, "cancelled"))
    deliveries.stop()
    assert "".join(piece for piece, _, _ in sender.sent) == "<1><2><3"
    *pieces, (_, flags, account) = sender.sent
    assert all(flags == 0 for _, flags, _ in pieces) and flags == FINAL
    assert account == {"finish_reason": [b"stop_word"], "completion_tokens": [3]}
    assert handle.cancelled == 1


class UnarySender:
    """Records a unary answer's tensors (or its error) and flags."""

    def __init__(self) -> None:
        self.sent: list[tuple[dict, int]] = []

    def send(self, response=None, flags: int = 0) -> None:
        assert response is not None and response.error is None, "an error was sent"
        self.sent.append((response.tensors, flags))

    def is_cancelled(self) -> bool:
        return False


def test_a_stop_word_in_a_unary_rows_text_ends_it_at_that_token(answers):
    """The engine's match on tokens misses "2><3" (no token's text): the row's text finds it at
    token 3, the row is dropped, and the one answer holds the tokens through 3, stop_word,
    whatever the engine generated past it before the drop."""
    deliveries = answers.Deliveries()
    sender = UnarySender()
    reply = answers.Reply(sender, 1, False, 1, lambda: None, deliveries)
    (row,) = reply.listeners([answers.TextStop(Decoder(), ["2><3"])])
    row.handle = handle = CancelledHandle()
    for token in (1, 2, 3, 4):
        row.on_token(token, 0.0)
    row.on_finish(GenerationResult([7], [1, 2, 3, 4], [0.0] * 4, "cancelled"))
    deliveries.stop()
    ((tensors, flags),) = sender.sent
    assert flags == FINAL and handle.cancelled == 1
    assert tensors["output_ids"].reshape(-1).tolist() == [7, 1, 2, 3]
    assert tensors["finish_reason"].reshape(-1).tolist() == [b"stop_word"]
    assert tensors["completion_tokens"].reshape(-1).tolist() == [3]


def test_a_unary_row_without_stop_words_in_its_text_ends_as_the_engine_says(answers):
    deliveries = answers.Deliveries()
    sender = UnarySender()
    reply = answers.Reply(sender, 1, False, 1, lambda: None, deliveries)
    (row,) = reply.listeners([answers.TextStop(Decoder(), ["<9>"])])
    row.handle = CancelledHandle()
    for token in (1, 2, 3):
        row.on_token(token, 0.0)
    row.on_finish(_done([1, 2, 3]))
    deliveries.stop()
    ((tensors, _),) = sender.sent
    assert tensors["output_ids"].reshape(-1).tolist() == [1, 2, 3, 1, 2, 3]
    assert tensors["finish_reason"].reshape(-1).tolist() == [b"length"]
    assert row.handle.cancelled == 0
