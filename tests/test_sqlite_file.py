"""The embedded store's file in an operator's hands: deleted or replaced under a running
server, full, or another program's. Real `relay serve` processes on real SQLite files."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
from conftest import free_port, start_server
from integration_support import immutable, relay, stop_server, wait_healthy


def _remember(url: str, key: str, body: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/memories",
        json={"body": body, "source": "team/ops"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )


def _bodies(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        return {r[0] for r in conn.execute("SELECT body FROM memories WHERE body IS NOT NULL")}


def test_a_database_file_deleted_or_replaced_under_the_server_takes_no_more_writes(
    tmp_path: Path,
):
    """QA: with its file deleted (or a backup moved over it), relay serve went on answering
    201 to every write, into the unlinked file, and /healthz said ok: everything written
    after was gone at the next restart."""
    db = tmp_path / "relay.db"
    server = start_server(db)
    try:
        wait_healthy(server, 30)
        assert _remember(server.url, server.admin_key, "Staging is the blue cluster.").is_success
        backup = tmp_path / "backup.db"
        with sqlite3.connect(db) as live, sqlite3.connect(backup) as copy:
            live.backup(copy)
        assert _remember(server.url, server.admin_key, "Deploys happen on Tuesdays.").is_success
        os.replace(backup, db)  # a restore done without stopping the server
        for leftover in (tmp_path / "relay.db-wal", tmp_path / "relay.db-shm"):
            leftover.unlink(missing_ok=True)
        refused = _remember(server.url, server.admin_key, "The canary runs in eu-west-1.")
        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert error["code"] == "unavailable"
        assert "deleted or replaced" in error["message"] and str(db) not in error["message"]
        assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 503
    finally:
        stop_server(server)
    # The restored file is as the backup left it: the refused write went nowhere.
    assert _bodies(db) == {"Staging is the blue cluster."}

    db.unlink()  # deleted outright: a restarted server would start afresh, so it must stop
    again = start_server(tmp_path / "second.db")
    try:
        wait_healthy(again, 30)
        (tmp_path / "second.db").unlink()
        refused = _remember(again.url, again.admin_key, "Written into a deleted file.")
        assert refused.status_code == 503, refused.text
    finally:
        stop_server(again)


def test_a_write_stored_before_its_embeddings_fail_to_cache_is_answered_as_stored(
    tmp_path: Path,
):
    """QA, on a full disk: the memory was committed, then caching its embeddings failed, and
    the writer was told 500 'the database failed this request': `relay remember` again made
    a second copy of it. The cache is only a cache: the write is answered as stored."""
    db = tmp_path / "relay.db"
    server = start_server(db)
    try:
        wait_healthy(server, 30)
        with sqlite3.connect(db) as conn:  # the cache's table refuses, as a full disk does
            conn.execute(
                "CREATE TRIGGER cache_full BEFORE INSERT ON embedding_cache"
                " BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"
            )
        answer = _remember(server.url, server.admin_key, "The ledger service listens on 7001.")
        assert answer.status_code == 201, answer.text
        found = httpx.get(
            f"{server.url}/v1/memories/{answer.json()['id']}",
            headers={"Authorization": f"Bearer {server.admin_key}"},
            timeout=30,
        )
        assert found.json()["body"] == "The ledger service listens on 7001."
    finally:
        stop_server(server)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM embedding_cache").fetchone() == (0,)


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """`path` made read-only by real means: the immutable attribute for root (who ignores
    permissions), its mode for anyone else."""
    if os.geteuid() != 0:
        path.chmod(0o400)
        try:
            yield
        finally:
            path.chmod(0o600)
        return
    with immutable(path):
        yield


def test_serve_on_a_database_it_cannot_write_or_create_stops_in_one_line(tmp_path: Path):
    """QA: on a file it may not write, relay serve started as healthy (SQLite opens it
    read-only without a word), answered searches and failed every write with 'the database
    failed this request'; where it could not create one, it printed a traceback."""
    (tmp_path / "afile").write_text("")
    for db, said in (
        (tmp_path / "afile" / "relay.db", "afile: a file, not a folder"),
        (tmp_path / "afile" / "sub" / "relay.db", "Not a directory"),
    ):
        done = relay(tmp_path, "serve", "--port", str(free_port()), "--db", str(db))
        assert done.returncode == 7 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith(f"relay: error: cannot create the database {db}: ")
        assert said in done.stderr and len(done.stderr.splitlines()) == 1
    db = tmp_path / "relay.db"
    assert relay(tmp_path, "org", "create", "acme", "--db", str(db)).returncode == 0
    with read_only(db):
        done = relay(tmp_path, "serve", "--port", str(free_port()), "--db", str(db))
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert f"the database {db} is read-only for this user" in done.stderr


def test_a_damaged_database_is_called_damaged_not_someone_elses(tmp_path: Path):
    """QA: a Relay database cut short (a disk that filled during a copy) was called 'not a
    Relay SQLite store', which sent the operator looking for the wrong file."""
    db = tmp_path / "relay.db"
    assert relay(tmp_path, "org", "create", "acme", "--db", str(db)).returncode == 0
    with db.open("r+b") as f:
        f.truncate(db.stat().st_size // 2)
    cut = db.read_bytes()
    for args in (["org", "list"], ["serve", "--port", str(free_port())]):
        done = relay(tmp_path, *args, "--db", str(db))
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
        assert f"relay: error: {db} is damaged (database disk image is malformed)" in done.stderr
        assert "restore it from a backup" in done.stderr
    assert db.read_bytes() == cut


def test_the_page_caches_of_every_request_thread_stay_within_400_mb(tmp_path: Path):
    """QA: each thread serving requests (40 in the server's pool) keeps a reader connection
    of its own, and each filled a page cache of up to 64 MiB: forty clients searching a
    20,000-memory file took relay serve from 427 MB to 2.4 GB of RSS, where deployment.md
    promised 800 MB at 100,000 passages. A reader's cache is small now (a page it lacks comes
    from the system's file cache; the same searches took as long, and 772 MB)."""
    import threading

    from relay.store.sqlite import SQLiteStore

    store = SQLiteStore(tmp_path / "relay.db")
    caches_kib: list[int] = []

    def serve_one() -> None:
        store.list_orgs()  # as a request's thread does: through its own reader
        caches_kib.append(-store._reader().execute("PRAGMA cache_size").fetchone()[0])

    threads = [threading.Thread(target=serve_one) for _ in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(caches_kib) == 40
    assert sum(caches_kib) * 1024 <= 400 * 2**20, caches_kib[:3]
    store.close()
