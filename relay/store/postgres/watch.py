"""A transaction run under a request's deadline ends soon after it, answered or not.

libpq waits on a query's socket for as long as the answer takes. A database that stops
answering without closing its connections (its host frozen or its storage stalled, or cut
off by the network without a reset, as when a failover moves its address) kept every
/healthz and search that met a pooled connection waiting, for minutes or for good: /healthz
never failed, so a load balancer kept the replica, and each request held its connection.

A transaction under a deadline (`relay.store.connect_by`: a search and its key check,
/healthz) is watched here: `GRACE_S` past the deadline its connection's socket is shut down,
which ends libpq's wait as a lost connection; the pool drops that connection and the request
answers 503 `unavailable`, as one that found the database down. The grace lets a statement
begun in time finish a little late, as it always could (a search reads its passages once its
stages are in), so a database that is merely busy loses no connections. Requests without a
deadline (writes) are not watched: a batch may rightly take longer; nor is work whose result
outlives the request (`connect_by(None)`: a replica's copy of an org's vectors).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from relay.errors import UnavailableError
from relay.store.postgres.failures import UNREACHABLE

GRACE_S = 1.0  # how long past its deadline a watched transaction may still wait


class StatementWatch:
    """One thread (started with the first watched transaction) that shuts down the socket of
    each watched transaction still waiting `GRACE_S` past its deadline."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[object, tuple[float, int]] = {}  # token -> (when, socket)
        self._fired: set[object] = set()
        self._thread: threading.Thread | None = None
        self._wakes_at: float | None = None  # when the thread wakes next (None: when told)
        self._closed = False

    @contextmanager
    def within(self, conn: psycopg.Connection[Any], deadline: float | None) -> Iterator[None]:
        """Watch `conn` for the block, if there is a `deadline` (a monotonic time). A
        connection cut after its work was done goes back to the pool, whose check on
        handing it out replaces it."""
        if deadline is None:
            yield
            return
        token, when = object(), deadline + GRACE_S
        with self._cond:
            self._due[token] = (when, conn.fileno())
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="relay-pg-watch", daemon=True
                )
                self._thread.start()
            if self._wakes_at is None or when < self._wakes_at:
                self._cond.notify()  # else it wakes in time anyway: no switch per statement
        try:
            yield
        except psycopg.OperationalError as exc:
            if self._done(token):
                lost = UnavailableError(
                    f"database unreachable: no answer {GRACE_S:g} s past the request's"
                    " deadline (the database stalled, or the network to it is cut)"
                )
                lost.public = UNREACHABLE
                raise lost from exc
            raise
        finally:
            self._done(token)

    def _done(self, token: object) -> bool:
        """Stop watching; whether the watch cut the connection."""
        with self._cond:
            self._due.pop(token, None)
            fired = token in self._fired
            self._fired.discard(token)
        return fired

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                for token, (when, fd) in list(self._due.items()):
                    if when <= now:
                        del self._due[token]
                        self._fired.add(token)
                        _cut(fd)
                self._wakes_at = min((when for when, _ in self._due.values()), default=None)
                self._cond.wait(None if self._wakes_at is None else self._wakes_at - now)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()


def _cut(fd: int) -> None:
    """Shut the socket down under libpq (through a duplicate, which alone is closed): its
    wait sees the connection end at once."""
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed
