"""Connections to the SQLite file, and the transactions every other part runs in.

One writer connection, shared and serialised on a lock with `BEGIN IMMEDIATE`; one reader
connection per thread, so searches never wait behind a write. sqlite3's errors become
Relay's here (`translate_errors`), once.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from relay.errors import StoreError, UnavailableError

# The page cache each connection may fill, in KiB. Every thread that serves requests keeps a
# reader of its own (40 in the server's pool), each with a cache of its own, so readers get a
# small one: forty clients searching a 20,000-memory file (172 MB) took relay serve from 427 MB
# to 2.4 GB of RSS at 64 MiB a reader, from 364 MB to 772 MB at 8 MiB, in the same time (a page
# a reader lacks comes from the system's file cache). The one writer keeps the larger cache,
# for the index pages of big batches.
WRITER_CACHE_KIB = 65_536
READER_CACHE_KIB = 8_192


@contextmanager
def translate_errors() -> Iterator[None]:
    """sqlite3's errors become Relay's, once, here."""
    try:
        yield
    except sqlite3.Error as exc:
        raise StoreError(f"database error: {exc}") from exc


def _create_private(path: Path) -> None:
    """Make a new database file readable by its owner alone (SQLite gives its -wal and -shm
    files the same mode): it holds every audience's memories, which the server alone may
    filter. A new folder for it is the owner's alone too; existing ones are left as found."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with suppress(FileExistsError):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as exc:  # a folder this user may not write, a read-only disk, a file
        why = exc.strerror or str(exc)
        if exc.filename is not None and str(exc.filename) != str(path):
            why = f"{exc.filename}: {'a file, not a folder' if path.parent.is_file() else why}"
        raise StoreError(f"cannot create the database {path}: {why}") from None


def file_identity(path: str) -> tuple[int, int] | None:
    """The (device, inode) of the file at `path` now; None when nothing is there."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


class SQLiteConnections:
    """The writer, the per-thread readers and the transactions on them (mixed into
    `SQLiteStore`, which opens the file and sets these attributes)."""

    path: str
    _local: threading.local
    _write_lock: threading.Lock
    _writer: sqlite3.Connection
    _identity: tuple[int, int] | None  # the file opened; None for ":memory:"

    def _check_file(self) -> None:
        """Refuse to go on once the file at `path` is no longer the one opened (deleted,
        or replaced by a restore or a move): SQLite keeps reading and writing the unlinked
        file, so every write acknowledged after that would vanish with the process."""
        if self._identity is None or file_identity(self.path) == self._identity:
            return
        gone = UnavailableError(
            f"the database file {self.path} was deleted or replaced while this server had it"
            " open, so nothing more is written to the old one (it would be lost); restart"
            " relay serve to open what is there now"
        )
        gone.public = (
            "the server's database file was deleted or replaced while it ran; it writes"
            " nothing until it is restarted"
        )
        raise gone

    def _connect(self, cache_kib: int) -> sqlite3.Connection:
        with translate_errors():
            conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=30
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA busy_timeout=30000")
            conn.execute(f"PRAGMA cache_size=-{int(cache_kib)}")
            conn.row_factory = sqlite3.Row
        return conn

    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect(READER_CACHE_KIB)
            self._local.conn = conn
        return conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._write_lock, translate_errors():
            self._check_file()  # under the lock: no write slips in between check and commit
            conn = self._writer
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            else:
                conn.execute("COMMIT")

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One consistent snapshot for several statements."""
        conn = self._reader()
        with translate_errors():
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")


def _bump(conn: sqlite3.Connection, org_id: str) -> None:
    conn.execute("UPDATE orgs SET generation = generation + 1 WHERE id = ?", (org_id,))
