"""Run what the primary backend cannot honour exactly on a second engine, instead of refusing it.

The server keeps the FasterTransformer GPT-J ensemble's contract: a request the default (openvino)
server refuses must be one FasterTransformer would refuse too. OpenVINO GenAI's pipeline lacks a
few of FasterTransformer's options (bad words beyond the end token, the beam diversity rate,
stop words with beams, a beam search's log probs after temperature and penalty), so
:meth:`OpenVINOBackend.validate` raises :class:`NotHonouredError` for them. The torch engine
honours all of them exactly; :class:`FallbackBackend` sends those requests there.

The secondary is made by a factory the first time a request needs it (most servers never load
it), and every request sent there is counted by reason, for the
``codegen_engine_fallback_requests_total`` metric (contract/metrics.py).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from engine.interface import (
    GenerationBackend,
    GenerationRequest,
    GenerationResult,
    Handle,
    Listener,
    ModelLimits,
    NotHonouredError,
    StepObserver,
    generate,
)

log = logging.getLogger(__name__)

# The ``reason`` label of the fallback counter: which option the primary could not honour.
REASONS = ("bad_words", "beam_diversity", "beam_stop_words", "log_probs", "token_healing", "other")
# The torch fallback's running batch: small, so that it takes little of the memory sized for the
# primary (its KV cache is released whenever it is idle).
FALLBACK_MAX_BATCH_SIZE = 8


class CountedFallback:
    """Where :meth:`FallbackBackend.route` sends a request the primary cannot honour: the
    secondary, with the reason counted when the request is submitted there. A request routed
    and then dropped (a later row of the same call refused, say) is no fallback."""

    def __init__(self, engine: GenerationBackend, reason: str, count: Callable[[str], None]):
        self.engine, self.reason, self._count = engine, reason, count

    def submit(
        self, request: GenerationRequest, listener: Listener, checked: bool = False
    ) -> Handle:
        handle = self.engine.submit(request, listener, checked=checked)
        self._count(self.reason)
        return handle


class FallbackBackend:
    """A GenerationBackend on two engines: the primary, and a secondary (made by ``make`` when a
    request first needs it) for the requests the primary refuses with NotHonouredError.

    ``on_fallback(reason)`` is told of each request sent to the secondary (the metrics)."""

    def __init__(
        self,
        primary: GenerationBackend,
        make: Callable[[], GenerationBackend],
        on_fallback: Callable[[str], None] | None = None,
    ) -> None:
        self.primary = primary
        self._make = make
        self._on_fallback = on_fallback
        self._secondary: GenerationBackend | None = None
        self._lock = threading.Lock()
        self._stopped = False
        self._counts: Counter[str] = Counter()

    # -- routing ------------------------------------------------------------------------------

    def _refusal(self, request: GenerationRequest) -> NotHonouredError | None:
        """The primary's NotHonouredError for this request, or None when it can run it (any
        other InvalidRequestError, a request no engine can run, propagates)."""
        try:
            self.primary.validate(request)
        except NotHonouredError as refusal:
            return refusal
        return None

    def _started_secondary(self, refusal: NotHonouredError) -> GenerationBackend:
        """The secondary, made and started once (under the lock: concurrent first requests
        load one copy). Should it fail to load, the request is refused as the primary did."""
        secondary = self._secondary
        if secondary is not None:
            return secondary
        with self._lock:
            if self._secondary is None:
                if self._stopped:
                    raise RuntimeError("engine is stopped")
                try:
                    self._secondary = self._make().start()
                except Exception as exc:
                    log.exception("the fallback engine could not start")
                    raise NotHonouredError(
                        f"{refusal} (the fallback engine could not start: {exc})", refusal.reason
                    ) from exc
                log.info("the fallback engine started, for: %s", refusal)
            return self._secondary

    @property
    def secondary(self) -> GenerationBackend | None:
        """The secondary engine once a request made it (None before)."""
        return self._secondary

    @property
    def fallbacks(self) -> dict[str, int]:
        """Requests sent to the secondary so far, by reason."""
        with self._lock:
            return dict(self._counts)

    # -- the GenerationBackend interface ------------------------------------------------------

    def validate(self, request: GenerationRequest) -> None:
        """The primary's verdict; what it cannot honour is checked against the secondary's
        limits instead (its batch and KV-cache budget are smaller). Nothing is remembered:
        ``submit`` decides again."""
        refusal = self._refusal(request)
        if refusal is not None:
            self._started_secondary(refusal).validate(request)

    def route(self, request: GenerationRequest) -> GenerationBackend | CountedFallback:
        """The primary when it can honour ``request``; else the secondary (made and started
        once), the request checked against its own limits, counted as a fallback once it is
        submitted there."""
        refusal = self._refusal(request)
        if refusal is None:
            return self.primary
        secondary = self._started_secondary(refusal)
        secondary.validate(request)
        reason = refusal.reason if refusal.reason in REASONS else "other"
        return CountedFallback(secondary, reason, self._count)

    def _count(self, reason: str) -> None:
        with self._lock:
            self._counts[reason] += 1
        if self._on_fallback is not None:
            self._on_fallback(reason)

    def submit(
        self, request: GenerationRequest, listener: Listener, checked: bool = False
    ) -> Handle:
        """Routed (:meth:`route`, which is the check whatever ``checked`` says), then queued
        there."""
        return self.route(request).submit(request, listener, checked=True)

    def wait_for_room(self, rows: int) -> None:
        """Wait on the primary's batch. The stage calls this before it knows where a request
        goes; nearly all go to the primary, whose room is what Triton's queue should show. A
        request for the secondary waits there in its own queue, admitted under its own budget;
        waiting on the secondary's small batch here would hold every ordinary request behind
        it in the stage's submit loop."""
        self.primary.wait_for_room(rows)

    def generate(self, request: GenerationRequest) -> GenerationResult:
        return generate(self.submit, request)

    def start(self) -> FallbackBackend:
        """Start the primary; the secondary starts when it is made."""
        self.primary.start()
        return self

    def stop(self) -> None:
        """Stop both (no secondary is made afterwards); their requests end as cancelled."""
        with self._lock:
            self._stopped = True
        self.primary.stop()
        if self._secondary is not None:
            self._secondary.stop()

    @property
    def running(self) -> int:
        return self.primary.running + (self._secondary.running if self._secondary else 0)

    @property
    def cache_bytes(self) -> int:
        return self.primary.cache_bytes + (self._secondary.cache_bytes if self._secondary else 0)

    @property
    def max_cache_tokens(self) -> int:
        """The primary's budget, the one requests are sized for (the secondary's own, smaller
        one is checked by its ``validate``)."""
        return self.primary.max_cache_tokens

    @property
    def alive(self) -> bool:
        """Both threads run (the secondary's once made): a dead secondary would leave its
        requests unanswered, so it ends the stub as a dead primary does."""
        secondary = self._secondary
        return self.primary.alive and (secondary is None or secondary.alive)

    @property
    def stopping(self) -> bool:
        return self.primary.stopping

    # -- what the stage and the tests read of the primary -------------------------------------

    @property
    def limits(self) -> ModelLimits:
        return self.primary.limits  # type: ignore[attr-defined]

    @property
    def shape(self):
        """The primary's ModelShape (vocabulary, context, end token, size)."""
        return self.primary.shape  # type: ignore[attr-defined]

    @property
    def observer(self) -> StepObserver | None:
        return self.primary.observer  # type: ignore[attr-defined]

    @property
    def max_batch_size(self) -> int:
        return self.primary.max_batch_size  # type: ignore[attr-defined]

    @property
    def max_beam_width(self) -> int:
        return self.primary.max_beam_width  # type: ignore[attr-defined]


def torch_fallback(checkpoint: Path, threads: int = 0, **limits) -> Callable[[], GenerationBackend]:
    """A factory of the torch engine on ``checkpoint`` (CPU, float32: the exactness reference).
    ``limits`` are the primary's (TorchEngine's keywords and ``observer``); the batch is
    FALLBACK_MAX_BATCH_SIZE rows and the KV-cache budget those rows at the model's context.

    Raises ValueError now, not inside a request, when the torch engine cannot load the
    checkpoint's model_type (config.json)."""
    import torch

    from engine.models import load_model, read_config
    from engine.threads import in_passing_thread
    from engine.torch_engine import TorchEngine

    read_config(checkpoint)  # the torch engine's own model_type check, before any weight
    limits.update(max_batch_size=FALLBACK_MAX_BATCH_SIZE, max_cache_tokens=None)

    def make() -> GenerationBackend:
        if threads > 0:
            torch.set_num_threads(threads)
        # loaded in a thread that ends, so the engine's thread is torch's only OpenMP pool
        model = in_passing_thread(lambda: load_model(checkpoint))
        return TorchEngine(model, **limits)

    return make


def with_fallback(
    setting: str,
    primary: GenerationBackend,
    checkpoint: Path,
    threads: int = 0,
    **limits,
) -> tuple[GenerationBackend, str]:
    """``primary`` as the ``fallback`` parameter (engine/config.pbtxt) says: wrapped with a
    torch fallback (``torch``), or alone (``none``, or a checkpoint the torch engine cannot
    load: its refusals stand); and what was done, for the log. ``limits`` are the primary's;
    their ``observer`` (the stage's metrics) serves both engines, and its ``on_fallback``, if
    it has one, hears of every request sent to the torch engine."""
    if setting not in ("torch", "none"):
        raise ValueError(f"fallback {setting!r} is not torch or none (engine/config.pbtxt)")
    if setting == "none":
        return primary, "no fallback"
    try:
        make = torch_fallback(checkpoint, threads, **limits)
    except ValueError as exc:
        return primary, f"no fallback: {exc}"
    note = f"torch fallback of {FALLBACK_MAX_BATCH_SIZE} rows"
    on_fallback = getattr(limits.get("observer"), "on_fallback", None)
    return FallbackBackend(primary, make, on_fallback), note
