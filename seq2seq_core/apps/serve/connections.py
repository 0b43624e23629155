"""What `s2s serve` holds for each client connection, bounded: how many connections, how long a
request may take to arrive, how long an answer may wait for a client that does not read.

uvicorn (the HTTP server) bounds the bytes of a request's head (h11's incomplete-event limit)
and closes idle keep-alive connections, but has no deadline for a request to arrive: its
keep-alive timer restarts on every byte received, so a client that trickles a header a byte at a
time, or never finishes a body, holds its connection and descriptor for ever (Slowloris). Nor
does it bound the time an answer waits in the write buffer of a client that does not read. So
the server runs uvicorn's h11 protocol with three guards, set by `Limits`:

* a cap on open connections: one more is answered 503 (JSON, `Retry-After`) and closed as soon
  as the client has read it (what it sends meanwhile is dropped; a reset would lose the 503);
* a deadline for a whole request (head and body) from its first byte (or the connection's
  opening): a request that has not arrived by then gets 408 (JSON) and its connection closes;
* a deadline for a client to read its answer: once the transport's write buffer is over its
  high-water mark, the client has that long to drain it, or the connection is aborted and the
  buffered answer released.

Each refusal is one log line naming the client, never a traceback.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("s2s")


@dataclass(frozen=True)
class Limits:
    """The bounds on connections (`s2s serve`'s defaults; /info lists them)."""

    connections: int = 256  # open connections at once (well under a process's 1,024 descriptors)
    # a client's time to send a whole request (from its first byte, or the connection's
    # opening) and to read a buffered answer
    client_seconds: float = 10.0


#: how long a refused connection is read (and its bytes dropped) after its 503, for the client
#: to read the answer and close first (`_refuse`)
LINGER_SECONDS = 2.0


def raw_answer(status: int, reason: str, message: str, extra: tuple = ()) -> bytes:
    """A whole HTTP/1.1 response with a JSON error body, written before h11 has a request."""
    body = json.dumps({"error": message}).encode()
    head = [
        f"HTTP/1.1 {status} {reason}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
        *extra,
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def guarded(limits: Limits) -> type:
    """uvicorn's h11 protocol with `limits` (see the module), as a class for `uvicorn.Config`."""

    class GuardedProtocol(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.arrival = None  # the deadline of the request arriving
            self.reading = None  # the deadline of the client reading the answer
            self.refused, self.lingering = False, None  # over the cap; its close (`_refuse`)
            if len(self.connections) > limits.connections:
                log.warning(
                    "refused a connection from %s: %d open, at most %d",
                    _who(self.client),
                    len(self.connections) - 1,
                    limits.connections,
                )
                self._refuse(
                    raw_answer(
                        503,
                        "Service Unavailable",
                        f"the server holds {limits.connections} connections, its most: try "
                        "again shortly",
                        ("retry-after: 1",),
                    )
                )
                return
            self._arm()

        def _refuse(self, answer: bytes) -> None:
            """Answer a connection over the cap and close it gracefully: the answer, then the
            end of our side (FIN), then what the client still sends is read and dropped until
            it closes, at most LINGER_SECONDS. Closing at once while the client's request lies
            unread in the socket makes the kernel reset the connection, and the client lost the
            503 to the reset (most refused clients that sent a request got a reset under load).
            A refused connection no longer counts against the cap."""
            self.refused = True
            self.connections.discard(self)
            self.transport.write(answer)
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.lingering = self.loop.call_later(LINGER_SECONDS, self.transport.close)

        def _arm(self) -> None:
            if self.arrival is None:
                self.arrival = self.loop.call_later(limits.client_seconds, self._too_slow)

        def _disarm(self, name: str) -> None:
            timer = getattr(self, name, None)
            if timer is not None:
                timer.cancel()
                setattr(self, name, None)

        def data_received(self, data: bytes) -> None:
            if self.refused:
                return  # a refused connection's request: dropped while it lingers
            if self.conn.their_state is h11.IDLE:  # the first bytes of a new request
                self._arm()
            super().data_received(data)
            if self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
                self._disarm("arrival")  # the whole request is here (or it failed)

        def _too_slow(self) -> None:
            self.arrival = None
            if self.transport.is_closing():
                return
            if self.cycle is not None and self.cycle.response_started:
                return
            log.warning(
                "closed a connection from %s: no whole request within %g s",
                _who(self.client),
                limits.client_seconds,
            )
            self.transport.write(
                raw_answer(
                    408,
                    "Request Timeout",
                    f"the request did not arrive whole within {limits.client_seconds:g} s",
                )
            )
            self.transport.close()

        def pause_writing(self) -> None:
            super().pause_writing()
            if self.reading is None:
                self.reading = self.loop.call_later(limits.client_seconds, self._not_reading)

        def resume_writing(self) -> None:
            super().resume_writing()
            self._disarm("reading")

        def _not_reading(self) -> None:
            self.reading = None
            log.warning(
                "closed a connection from %s: its answer was not read within %g s",
                _who(self.client),
                limits.client_seconds,
            )
            self.transport.abort()  # drops the buffered answer

        def eof_received(self):
            if self.refused:  # the client read its 503 and closed: close now
                self.transport.close()
                return None
            return super().eof_received()

        def connection_lost(self, exc) -> None:
            self._disarm("arrival")
            self._disarm("reading")
            self._disarm("lingering")
            super().connection_lost(exc)

    return GuardedProtocol


def _who(client) -> str:
    return "%s:%d" % client if client else "a client"
