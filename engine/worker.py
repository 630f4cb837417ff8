"""What both backends do the same way around their own loop: one request queue, one owner
thread, submit, start and stop, backpressure and the blocking ``generate``.

The torch engine and the OpenVINO backend differ in what their thread does each turn, not in
how a request gets to it or how the thread starts and ends; keeping that here means the
``GenerationBackend`` promises (a cancelled or stopped request is still answered, once;
``wait_for_room`` returns when stopping) hold for both by construction.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Generic, Self

from engine.interface import (
    GenerationRequest,
    GenerationResult,
    Handle,
    Listener,
    StepObserver,
    generate,
)
from engine.scheduler import RequestQueue, W


class QueueWorker(Generic[W]):
    """A backend's request queue and owner thread. Subclasses say how a request becomes an
    entry (``_entry``), what the thread does (``_work``), which running entries to answer on
    stop (``_take_running``) and how to answer one (``_finish``)."""

    thread_name = "engine"

    def __init__(self, queue: RequestQueue[W]) -> None:
        self._queue = queue
        self._thread: threading.Thread | None = None

    def validate(self, request: GenerationRequest) -> None:
        raise NotImplementedError

    def route(self, request: GenerationRequest) -> Self:
        """Check ``request`` (``validate``); this backend runs it."""
        self.validate(request)
        return self

    def submit(
        self, request: GenerationRequest, listener: Listener, checked: bool = False
    ) -> Handle:
        """Queue a request; the listener hears each token and then the result. Unless
        ``checked`` (by :meth:`route`), it is checked first."""
        if not checked:
            self.validate(request)
        handle = Handle()
        self._queue.put(self._entry(request, listener, handle))
        return handle

    def wait_for_room(self, rows: int) -> None:
        """Block until ``rows`` more rows fit in the running batch (RequestQueue says why)."""
        self._queue.wait_for_room(rows)

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Blocking convenience: submit and wait for the result."""
        return generate(self.submit, request)

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._work, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the worker; requests still queued or running finish as cancelled."""
        self._queue.stop()
        if self._thread is not None:
            self._thread.join()
        for entry in self._queue.take_all() + self._take_running():
            self._finish(entry, "cancelled", "server is shutting down")

    @property
    def observer(self) -> StepObserver | None:
        """Told about every step and every answer (the metrics); fixed at construction."""
        return self._queue.observer

    @property
    def stopping(self) -> bool:
        return self._queue.stopping

    @property
    def alive(self) -> bool:
        """Whether the worker thread is running (false before start, after stop or a crash)."""
        return self._thread is not None and self._thread.is_alive()

    def _entry(self, request: GenerationRequest, listener: Listener, handle: Handle) -> W:
        raise NotImplementedError

    def _work(self) -> None:
        raise NotImplementedError

    def _take_running(self) -> list[W]:
        """Empty the running set (the thread has ended); the entries that answer a request."""
        raise NotImplementedError

    def _finish(self, entry: W, reason: str, error: str | None = None) -> None:
        raise NotImplementedError

    def _answer(
        self,
        entry: W,
        output_ids: list[int],
        log_probs: list[float],
        reason: str,
        error: str | None = None,
        **extra: Any,
    ) -> None:
        """Answer ``entry``'s request: its result, timed from its submission and admission
        (``extra``: the result's other fields), through the queue, which frees its rows."""
        now = time.perf_counter()
        result = GenerationResult(
            prompt_ids=list(entry.request.prompt_ids),
            output_ids=list(output_ids),
            log_probs=list(log_probs),
            finish_reason=reason,
            error=error,
            queue_seconds=(entry.admitted or now) - entry.submitted,
            total_seconds=now - entry.submitted,
            **extra,
        )
        self._queue.answer(entry, result)
