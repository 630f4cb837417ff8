"""A caller reads a BLS response only once the engine said it is there (backend/bls_ready.py):
python_backend's response iterator deadlocks its stub when ``next()`` has to wait."""

from __future__ import annotations

import itertools
import os
import threading
import time

import pytest

from backend.bls_ready import ReadyListener, ReadyTeller, TellingSender, owner_pid
from backend.cancel import new_key


class Reply(str):
    """A response: its text, and whether it is an error response."""

    error = False

    def has_error(self) -> bool:
        return self.error


class Rejection(Reply):
    error = True


class FakeReplies:
    """A response iterator that fails the test if ``next()`` is called with nothing queued:
    the engine queues a response, then tells (as python_backend's send returns after the
    caller's stub queued it)."""

    def __init__(self) -> None:
        self.queued: list[object] = []
        self.finished = False
        self.lock = threading.Lock()
        self.empty_reads = 0

    def queue(self, reply: object, final: bool) -> None:
        with self.lock:
            self.queued.append((Reply(reply) if type(reply) is str else reply, final))

    def __next__(self):
        with self.lock:
            if self.finished:
                raise StopIteration
            if not self.queued:
                self.empty_reads += 1  # the real stub would wait here, and can deadlock
                raise AssertionError("next() called with no response queued")
            reply, final = self.queued.pop(0)
            self.finished = final
            return reply if reply is not None else Reply("")


class FakeSender:
    def __init__(self, replies: FakeReplies) -> None:
        self.replies = replies

    def send(self, response=None, flags: int = 0) -> None:
        self.replies.queue(response, bool(flags))

    def is_cancelled(self) -> bool:
        return False


PIDS = itertools.count(900_000_000 + os.getpid() * 100)  # no real process's pid


@pytest.fixture
def listener():
    ready = ReadyListener(pid=next(PIDS))
    yield ready
    ready.close()


def test_the_key_names_the_caller_that_reads_it():
    key = new_key(4242)
    assert owner_pid(key) == 4242
    assert owner_pid(new_key()) is None
    assert owner_pid("a-client-id") is None
    assert new_key(1) != new_key(1)


def test_each_response_is_read_only_after_the_engine_told_of_it(listener):
    key = new_key(listener.pid)
    replies = FakeReplies()
    teller = ReadyTeller()
    sender = TellingSender(FakeSender(replies), key, teller)
    listener.expect(key)
    read: list[object] = []

    def reader() -> None:
        read.extend(listener.responses(key, replies))

    sender.send("token 0")  # exec returns once the first response is there
    thread = threading.Thread(target=reader)
    thread.start()
    for token in range(1, 50):
        sender.send(f"token {token}")
        if token % 7 == 0:
            time.sleep(0.01)  # the reader catches up and waits for word
    sender.send(flags=1)  # the final flag alone
    thread.join(timeout=30)
    teller.close()
    assert not thread.is_alive()
    assert read == [f"token {token}" for token in range(50)] + [""]
    assert replies.empty_reads == 0


def test_a_single_final_response_ends_the_reading(listener):
    key = new_key(listener.pid)
    replies = FakeReplies()
    teller = ReadyTeller()
    listener.expect(key)
    TellingSender(FakeSender(replies), key, teller).send("the answer", 1)
    assert list(listener.responses(key, replies)) == ["the answer"]
    teller.close()


def test_word_on_a_key_nobody_reads_is_dropped(listener):
    teller = ReadyTeller()
    teller.tell(new_key(listener.pid), final=True)  # no expect(): not counted, no error
    key = new_key(listener.pid)
    replies = FakeReplies()
    listener.expect(key)
    TellingSender(FakeSender(replies), key, teller).send("mine", 1)
    assert list(listener.responses(key, replies)) == ["mine"]
    teller.close()


def test_a_caller_that_is_not_listening_does_not_stop_the_engine():
    teller = ReadyTeller(timeout_s=0.5)
    teller.tell(new_key(999_999_999), final=False)  # nobody listens there: logged, no raise
    teller.tell("codegen-" + "0" * 32, final=False)  # no pid in it: a direct client
    teller.close()


def test_a_response_from_triton_itself_is_read_without_word(listener):
    """A full queue or a queue timeout: Triton answers the BLS request with an error and the
    engine never sees it, so no word comes; it is the first and last response."""
    key = new_key(listener.pid)
    replies = FakeReplies()
    replies.queue(Rejection("the queue is full"), final=True)
    listener.expect(key)
    read = list(listener.responses(key, replies))
    assert read == ["the queue is full"] and read[0].has_error()
    assert replies.empty_reads == 0


def test_the_first_response_needs_no_word(listener):
    """``exec`` returns with the first response queued: reading it waits for nothing."""
    key = new_key(listener.pid)
    replies = FakeReplies()
    replies.queue("first", final=False)  # the engine's word is still on its way
    listener.expect(key)
    told = listener.responses(key, replies)
    assert next(told) == "first"
    teller = ReadyTeller()
    sender = TellingSender(FakeSender(replies), key, teller)
    teller.tell(key, final=False)  # the late word of the first response
    sender.send("second", 1)
    assert list(told) == ["second"]
    assert replies.empty_reads == 0
    teller.close()
