"""Calling the one engine (the ``engine`` model) from ``gptj``, the unary ensemble's model stage.

``gptj`` holds no engine of its own: a plain (not decoupled) model, because HTTP and unary gRPC
refuse an ensemble with a decoupled step, it reaches the decoupled ``engine`` by BLS, the one
hop Triton 2.51 forces on the unary path. Each Triton request it gets is checked here
(:meth:`EngineCalls.check`), and its tensors, unchanged, become one BLS request to the
``engine`` model, run in a worker thread so that ``execute`` returns at once and
requests overlap in the engine's running batch.

Because a BLS request cannot be cancelled in Triton 2.51 (see backend/cancel.py), a watcher
asks Triton every ``poll_s`` whether each caller's client went away (a gRPC cancel or deadline)
and, if so, sends the engine the request's key.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

from backend.bls_ready import ReadyListener
from backend.cancel import CancelSender, new_key
from backend.io import FINAL, error_response
from contract import metrics as names
from contract.tensors import ENGINE_MODEL, MODEL_IO, MODEL_STAGE
from engine.interface import ModelLimits
from engine.tensors import requests_from_tensors

# Requests a caller runs at once: the engine's queue (256) and batch (64) hold no more. Past
# this, execute waits and the next requests wait in the caller's own bounded Triton queue.
MAX_IN_FLIGHT = 320
POLL_S = 0.25  # how often the watcher asks whether a caller's client went away
# All slots taken and none freed for this long means the calls wait for what never comes (the
# engine's queue rejects what waits 120 s): the stub exits rather than look healthy.
WEDGED_AFTER_S = 300.0
# How long a finished BLS response iterator is kept referenced from Python (see _Retired).
KEEP_ITERATORS_S = 10.0


class Call:
    """One caller request's answer, sent only through here: once its final response is sent
    Triton frees the request, and asking it then whether it was cancelled crashes the server
    (a segfault in ``TRITONBACKEND_ResponseFactoryIsCancelled``), so the watcher and the final
    send take turns under a lock."""

    def __init__(
        self,
        sender,
        key: str,
        requested: frozenset[str] | None = None,
        client_id: str = "",
    ) -> None:
        self.sender, self.key, self.requested = sender, key, requested
        self.client_id = client_id  # the id the client gave its request (a stop request's)
        self.stopped = False  # a stop request named it
        self._lock = threading.Lock()
        self.closed = False

    def final(self, answer=None) -> None:
        """The last response (or only the final flag); later calls do nothing."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if answer is None:
                self.sender.send(flags=FINAL)
            else:
                self.sender.send(answer, flags=FINAL)

    def client_gone(self) -> bool:
        """Whether Triton marked the request cancelled (False once it is answered)."""
        with self._lock:
            return not self.closed and self.sender.is_cancelled()


class _Retired:
    """Finished BLS response iterators, kept referenced from Python for ``keep_s``.

    In python_backend r24.10 the stub also holds each decoupled BLS response iterator in a map,
    which its own message thread (holding no GIL) clears shortly after the final response was
    read. If Python dropped its reference first, that thread destroys the iterator and every
    response tensor in it, freeing their numpy arrays without the GIL: with other threads
    running Python that corrupts the stub's heap (``malloc(): unaligned fastbin chunk``), and a
    stub whose heap is corrupt can tell the server to free a live BLS request's payload
    (``std::bad_weak_ptr`` in tritonserver). Kept here until the stub's map let go, the last
    reference is Python's, dropped by the watcher thread, which holds the GIL.
    (python_backend r24.12 destroys tensors under the GIL: "Hold GIL when deleting numpy
    array".)"""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self._lock = threading.Lock()
        self._items: deque[tuple[float, object]] = deque()

    def add(self, iterator) -> None:
        with self._lock:
            self._items.append((time.monotonic() + self.keep_s, iterator))

    def release_due(self) -> int:
        """Drop the iterators kept long enough; returns how many."""
        now, due = time.monotonic(), []
        with self._lock:
            while self._items and self._items[0][0] <= now:
                due.append(self._items.popleft())
        count = len(due)
        del due  # the iterators are destroyed here, in a Python thread, under the GIL
        return count

    def __len__(self) -> int:
        return len(self._items)


class CallerMetrics:
    """A caller model's cancellations passed on and calls in flight, on Triton's metrics port:
    what shows that abandoned requests are let go of (and when they are not).

    One lock around every metric call: in python_backend r24.10 a metric's update writes the
    metric's own shared-memory message, so two threads updating one metric at once hand the
    server a freed message (a segfault in ``Metric::LoadFromSharedMemory`` in tritonserver,
    found by loadtest/stress.py)."""

    def __init__(self, model_name: str) -> None:
        labels = {"model": model_name}
        self._lock = threading.Lock()
        self.families = []  # a family must outlive its metrics
        self.m = {}
        kinds = [
            (names.CALLER_METRIC_HELP, pb_utils.MetricFamily.COUNTER),
            (names.CALLER_GAUGE_HELP, pb_utils.MetricFamily.GAUGE),
        ]
        for helps, kind in kinds:
            for name, description in helps.items():
                family = pb_utils.MetricFamily(name=name, description=description, kind=kind)
                self.families.append(family)
                self.m[name] = family.Metric(labels=labels)

    def cancel_sent(self) -> None:
        with self._lock:
            self.m[names.CANCELS_SENT].increment(1)

    def in_flight(self, count: int) -> None:
        with self._lock:
            self.m[names.CALLS_IN_FLIGHT].set(count)


class EngineCalls:
    """A caller model's engine requests in flight, their threads, and their cancellation."""

    def __init__(
        self,
        model_name: str,
        limits: ModelLimits,
        engine_model: str = ENGINE_MODEL,
        max_in_flight: int = MAX_IN_FLIGHT,
        poll_s: float = POLL_S,
        keep_iterators_s: float = KEEP_ITERATORS_S,
    ) -> None:
        self.engine_model = engine_model
        self.limits = limits
        self.metrics = CallerMetrics(model_name)
        self.max_in_flight = max_in_flight
        self.slots = threading.BoundedSemaphore(max_in_flight)
        self.pool = ThreadPoolExecutor(max_in_flight, thread_name_prefix="engine-call")
        self.cancels = CancelSender(engine_model)
        self.ready = ReadyListener()
        self.poll_s = poll_s
        self.retired = _Retired(keep_iterators_s)
        self._lock = threading.Lock()
        self._watched: dict[str, Call] = {}
        self._in_flight = 0
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="engine-cancels", daemon=True)
        self._watcher.start()

    def start(
        self,
        sender,
        work: Callable[[Call], None],
        requested: frozenset[str] | None = None,
        client_id: str = "",
    ) -> None:
        """Run ``work(call)`` in a worker thread; ``call.key`` names its engine request.
        Blocks while ``max_in_flight`` calls run. ``work`` answers through ``call``; if it
        raises, the request gets the error (and the log says why)."""
        if not self.slots.acquire(timeout=WEDGED_AFTER_S):
            # no call ended for that long: the calls in flight wait for something that will
            # never come; a stub that can serve nothing must not keep looking healthy
            pb_utils.Logger.log_error(
                f"no engine call ended in {WEDGED_AFTER_S:.0f} s with all {self.max_in_flight} "
                "slots taken: exiting this stub so that the launcher restarts the server"
            )
            os._exit(70)  # EX_SOFTWARE; the launcher's watchdog sees the dead stub
        call = Call(sender, new_key(self.ready.pid), requested, client_id)
        with self._lock:
            self._watched[call.key] = call
            self._in_flight += 1
            self.metrics.in_flight(self._in_flight)
        try:
            self.pool.submit(self._run, call, work)
        except BaseException:
            self._done(call)
            raise

    def _run(self, call: Call, work: Callable[[Call], None]) -> None:
        try:
            work(call)
        except Exception as exc:  # a bug: fail this request only, and say so in the log
            pb_utils.Logger.log_error(f"engine call failed: {exc!r}")
            with contextlib.suppress(Exception):
                call.final(error_response(f"internal error: {exc}"))
        finally:
            with contextlib.suppress(Exception):
                call.final()  # never leave a request unanswered
            self._done(call)

    def _done(self, call: Call) -> None:
        with self._lock:
            self._watched.pop(call.key, None)
            self._in_flight -= 1
            self.metrics.in_flight(self._in_flight)
        self.slots.release()

    def check(self, arrays: Mapping[str, np.ndarray]) -> None:
        """InvalidRequestError for a request (the model stage's tensors) that the engine would
        refuse for its options or size, so that it is refused here at once rather than after
        waiting in the engine's queue behind valid work (under overload that wait can outlast
        its queue timeout). The engine is sent the same tensors."""
        rows, _ = requests_from_tensors(arrays)
        for row in rows:
            self.limits.check(row)

    def cancel(self, call: Call) -> None:
        """Tell the engine to drop the call's rows (once)."""
        with self._lock:
            if self._watched.pop(call.key, None) is None:
                return
        if self.cancels.cancel(call.key):
            self.metrics.cancel_sent()

    def stop_client_requests(self, client_id: str) -> int:
        """Stop every call whose client request has ``client_id`` (a stop request's work);
        returns how many were generating."""
        with self._lock:
            named = [c for c in self._watched.values() if c.client_id == client_id]
        for call in named:
            call.stopped = True
            self.cancel(call)
        return len(named)

    def _watch(self) -> None:
        while not self._stopping.wait(self.poll_s):
            self.retired.release_due()
            with self._lock:
                watched = list(self._watched.values())
            for call in watched:
                try:
                    gone = call.client_gone()
                except Exception:
                    continue
                if gone:
                    self.cancel(call)

    def responses(self, call: Call, arrays: Mapping[str, np.ndarray]) -> Iterator:
        """The engine's responses to one request (the model stage's tensors, once :meth:`check`
        passed them), as they come, each read only once the engine said it is there
        (backend/bls_ready.py says why). The caller reads them to the end (the final response);
        the iterator is then kept alive a while (``_Retired`` says why)."""
        inputs = [pb_utils.Tensor(name, array) for name, array in arrays.items()]
        self.ready.expect(call.key)
        replies = pb_utils.InferenceRequest(
            model_name=self.engine_model,
            inputs=inputs,
            requested_output_names=[spec.name for spec in MODEL_IO[MODEL_STAGE][1]],
            request_id=call.key,
        ).exec(decoupled=True)
        told = self.ready.responses(call.key, replies)
        finished = False
        try:
            for reply in told:  # noqa: UP028 (``yield from`` would close ``told`` early)
                yield reply
            finished = True
        finally:
            if not finished:  # the caller stopped early (a bug): stop the engine, read on
                self.cancel(call)
                for _ in told:
                    pass
            self.retired.add(replies)
            del replies, told

    def stop(self) -> None:
        self._stopping.set()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.cancels.close()
        self.ready.close()


def copied(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Arrays owned by this process: a request's tensors are read in ``execute`` and used in a
    worker thread after it returned."""
    return {name: np.array(array, copy=True) for name, array in arrays.items()}
