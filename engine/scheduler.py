"""Who runs next: the waiting requests, backpressure into Triton's queue, and which waiting
requests the torch engine admits under its batch, prefill and KV-cache budgets.

Both backends keep their submitted requests in a :class:`RequestQueue`: it counts the rows not
yet answered, which is what ``wait_for_room`` waits on, and it answers a request (so that the
count, the listener and the metrics are told in the same order by every backend).
:class:`Scheduler` is the torch engine's admission rule; the OpenVINO pipeline has its own.
Plain Python: no torch, no OpenVINO.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from contract.options import DEFAULT_MAX_BEAM_WIDTH
from engine.interface import (
    GenerationRequest,
    GenerationResult,
    Handle,
    Listener,
    StepObserver,
    check_cache_budget,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    """The running batch's limits (``engine_max_batch_size``, ``engine_max_prefill_tokens``,
    ``kv_cache_tokens`` and ``max_beam_width`` in model_repository/engine/config.pbtxt)."""

    max_batch_size: int = 32  # rows generating at once
    max_prefill_tokens: int = 4096  # padded prompt tokens one step may prefill
    max_cache_tokens: int | None = None  # rows x positions; None: rows x the model's context
    max_beam_width: int = DEFAULT_MAX_BEAM_WIDTH

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_prefill_tokens", "max_beam_width"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_cache_tokens is not None and self.max_cache_tokens < 1:
            raise ValueError(
                f"max_cache_tokens must be >= 1 (or None for the default), "
                f"got {self.max_cache_tokens}"
            )

    def cache_tokens(self, context: int) -> int:
        """The KV-cache budget: as configured, or every row at the whole context."""
        return self.max_cache_tokens or self.max_batch_size * context

    @property
    def beam_width(self) -> int:
        """The widest beam search: a beam takes a row, so never wider than the batch."""
        return min(self.max_beam_width, self.max_batch_size)


class Waiting(Protocol):
    """What the queue needs of a submitted request (and the worker, to time its answer)."""

    request: GenerationRequest
    listener: Listener
    handle: Handle
    submitted: float  # time.perf_counter() at submit
    admitted: float  # when it began to run; 0.0 until then


W = TypeVar("W", bound=Waiting)


class RequestQueue(Generic[W]):
    """Submitted requests not yet taken by the worker, and the rows not yet answered.

    One condition guards both, so that ``wait_for_room`` wakes when a request is answered and
    the worker wakes when one is submitted or the backend stops. It is re-entrant: a backend
    may answer a request while it holds the lock.
    """

    def __init__(self, max_batch_size: int, observer: StepObserver | None = None) -> None:
        self.max_batch_size = max_batch_size
        self.observer = observer
        self.lock = threading.Condition()  # an RLock underneath
        self.waiting: deque[W] = deque()
        self.stopping = False
        self.unfinished = 0  # rows submitted and not yet answered (waiting, prefilling, running)

    def put(self, entry: W) -> None:
        with self.lock:
            if self.stopping:
                raise RuntimeError("engine is stopped")
            self.waiting.append(entry)
            self.unfinished += entry.request.rows
            self.lock.notify_all()

    def wait_for_room(self, rows: int) -> None:
        """Block until ``rows`` more rows fit in the running batch.

        The Triton adapter calls this before submitting, so that a request the engine cannot
        start yet waits in Triton's queue, where ``nv_inference_queue_duration_us`` and the
        pending-request count show the overload (and an autoscaler can act on it), rather than
        in a private queue no metric sees. A request wider than the batch waits for an empty
        engine; every wait ends when the backend stops.
        """
        with self.lock:
            while self.unfinished > 0 and self.unfinished + rows > self.max_batch_size:
                if self.stopping:
                    return
                self.lock.wait()

    def next_turn(self, busy: bool, on_idle: Callable[[], None] | None = None) -> bool:
        """The worker's wait for work (``busy``: it has running rows). Calls ``on_idle`` first
        when there is none. Returns False once the backend is stopping."""
        with self.lock:
            idle = not (self.waiting or busy or self.stopping)
            if idle and on_idle is not None:
                on_idle()
            while not (self.waiting or busy or self.stopping):
                self.lock.wait()
            return not self.stopping

    def take_all(self) -> list[W]:
        with self.lock:
            taken = list(self.waiting)
            self.waiting.clear()
            return taken

    def stop(self) -> None:
        """Refuse new requests and wake the worker and every ``wait_for_room``."""
        with self.lock:
            self.stopping = True
            self.lock.notify_all()

    def answer(self, entry: W, result: GenerationResult) -> None:
        """Free the request's rows, then tell its listener and the observer. A hook that
        raises is logged: it must never end the worker."""
        with self.lock:
            self.unfinished -= entry.request.rows
            self.lock.notify_all()  # room for requests held in wait_for_room
        for hook in (entry.listener.on_finish, getattr(self.observer, "on_finish", None)):
            if hook is None:
                continue
            try:
                hook(result)
            except Exception:
                log.exception("on_finish failed")


class Scheduled(Waiting, Protocol):
    """What the scheduler needs of a request waiting or running in the torch engine."""

    @property
    def reach(self) -> int: ...


S = TypeVar("S", bound=Scheduled)


class Scheduler(Generic[S]):
    """The torch engine's admission: before each step, which waiting requests join the running
    batch. They are taken in order while there are free rows, their padded prompts fit the
    prefill budget, and every row at the longest reach fits the KV-cache budget; the first
    that does not fit waits (no overtaking, so a wide request is not starved)."""

    def __init__(
        self,
        config: EngineConfig,
        context: int,
        capacity_for: Callable[[int], int],
        queue: RequestQueue[S],
    ) -> None:
        self.config = config
        self.max_cache_tokens = config.cache_tokens(context)
        self.capacity_for = capacity_for  # positions the cache allocates for a length
        self.queue = queue

    def check_budget(self, request: GenerationRequest) -> None:
        """Refuse a request whose cache could never fit the budget, even alone."""
        total = len(request.prompt_ids) + request.max_new_tokens
        needed = request.beam.width * self.capacity_for(total)
        check_cache_budget(request, needed, self.max_cache_tokens)

    def admit(self, running: Sequence[S]) -> tuple[list[S], list[S]]:
        """(admitted, cancelled): waiting requests that join the batch now, in order, and
        those whose caller cancelled them while they waited (the caller answers both)."""
        admitted: list[S] = []
        cancelled: list[S] = []
        free = self.config.max_batch_size - len(running)
        longest = 0
        reach = max((r.reach for r in running), default=0)
        taken = 0  # rows the admitted requests take (beam searches take several)
        waiting = self.queue.waiting
        with self.queue.lock:
            while waiting:
                entry = waiting[0]
                if entry.handle.cancelled.is_set():
                    cancelled.append(waiting.popleft())
                    continue
                if taken + entry.request.rows > free:
                    break
                length = max(longest, len(entry.request.prompt_ids))
                if admitted and length * (len(admitted) + 1) > self.config.max_prefill_tokens:
                    break
                rows = len(running) + taken + entry.request.rows
                reach = max(reach, entry.reach)
                if rows * self.capacity_for(reach) > self.max_cache_tokens:
                    break  # waits until finished requests free the cache
                longest = length
                taken += entry.request.rows
                admitted.append(waiting.popleft())
        return admitted, cancelled
