"""Many gRPC streams on one channel.

tritonclient keeps one stream per ``InferenceServerClient`` object, and each object opens a
channel of its own: a TCP connection and its handshake for every stream. But a stream is one
call on its client's channel, and HTTP/2 carries many calls on one connection: a copy of the
unary client with no stream of its own carries another stream on the same channel.
"""

from __future__ import annotations

import copy
from typing import Any


class _SharedChannel:
    """A gRPC channel that a stream's client uses but does not own: closing it does nothing."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel

    def close(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)


def stream_client(unary: Any) -> Any:
    """A client for one stream on ``unary``'s channel (a ``tritonclient.grpc`` client)."""
    client = copy.copy(unary)
    client._stream = None  # tritonclient's per-object stream slot
    # the channel is ``unary``'s: the copy's close (also on garbage collection) must not
    # close it under the unary client and the other streams
    client._channel = _SharedChannel(unary._channel)
    return client
