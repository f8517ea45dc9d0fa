"""The embedded store: one SQLite file in WAL mode.

One writer connection (writes serialise on a lock and `BEGIN IMMEDIATE`),
a reader connection per thread, so searches never wait behind a write.
Every query that returns memory content carries the access filter built by
`visible_sql()`: tenant, audience, expiry, deletion and supersession are
decided by SQL, never by filtering rows afterwards.

`SQLiteStore` is put together from one part per concern, each a module here:
`connection` (connections, transactions, error translation), `orgs` (organisations
and keys), `writes` (saves, deletes, supersession links), `totals` (the per-org counts
writes keep for scoring), `reads` (memory reads and the access filters), `search` (the
search stages and document frequencies), `embeddings` (embedding cache and token
matrices), `reports` (the hook outcomes developers send) and `rows` (stored values as
models). Opening the file and migrating its
schema (`migrations_sqlite`), then mending the totals an older release left
(`totals.repair_passage_totals`), stay here.
"""

from __future__ import annotations

import functools
import sqlite3
import threading
import time
from pathlib import Path

from relay.store.migrations_sqlite import MIGRATIONS
from relay.store.sqlite.connection import (
    WRITER_CACHE_KIB,
    SQLiteConnections,
    _create_private,
    file_identity,
    translate_errors,
)
from relay.store.sqlite.embeddings import EmbeddingsAndTokens
from relay.store.sqlite.orgs import OrgsAndKeys
from relay.store.sqlite.reads import MemoryReads
from relay.store.sqlite.reports import HookOutcomes
from relay.store.sqlite.search import SearchStages
from relay.store.sqlite.totals import repair_passage_totals
from relay.store.sqlite.writes import MemoryWrites
from relay.store.vector_index import VectorIndex

__all__ = ["SQLiteStore"]


class SQLiteStore(
    OrgsAndKeys,
    MemoryWrites,
    MemoryReads,
    SearchStages,
    EmbeddingsAndTokens,
    HookOutcomes,
    SQLiteConnections,
):
    """The embedded store (see module docstring): its parts are mixed in from the modules
    beside this one, each holding one concern."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            _create_private(Path(self.path))
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._writer = self._connect(WRITER_CACHE_KIB)
        self._identity = None if self.path == ":memory:" else file_identity(self.path)
        self.vectors = VectorIndex()
        self._migrate()

    def _migrate(self) -> None:
        with self._write() as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations"
                " (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
            )
            done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
            for version, script in enumerate(MIGRATIONS, start=1):
                if version in done:
                    continue
                for statement in _split_script(script):
                    conn.execute(statement)
                conn.execute("INSERT INTO schema_migrations VALUES (?, ?)", (version, time.time()))
            repair_passage_totals(conn)

    def schema_version(self) -> int:
        with translate_errors():
            return (
                self._reader().execute("SELECT max(version) FROM schema_migrations").fetchone()[0]
            )

    def warm(self) -> None:
        """Bring every org's in-memory vectors up to date (about a second per 10^5
        passages), waiting for them rather than answering from an older copy."""
        for org in self.list_orgs():
            load = functools.partial(self._vector_rows, org.id)
            self.vectors.get(org.id, self.generation(org.id), load, wait=True)

    def close(self) -> None:
        with translate_errors():
            self._writer.close()
            conn = getattr(self._local, "conn", None)
            if conn is not None:
                conn.close()
                self._local.conn = None


def _split_script(script: str) -> list[str]:
    """Split a migration into statements, keeping trigger bodies whole."""
    statements, buf = [], []
    for line in script.splitlines():
        buf.append(line)
        joined = "\n".join(buf).strip()
        if joined.endswith(";") and sqlite3.complete_statement(joined):
            statements.append(joined)
            buf = []
    if "\n".join(buf).strip():
        statements.append("\n".join(buf))
    return statements
