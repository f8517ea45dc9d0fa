"""`relay migrate --from sqlite:///... --to postgresql://...`: move a store to PostgreSQL.

Copies, per organisation: the org, its keys (hashes only; secrets were never
stored), every memory with its full revision history (tombstones included),
audiences, passages with their embeddings and token matrices; then the org's
totals (passages, tokens, each term's and each audience set's passages) are
counted on the target from what it holds; then the shared embedding cache.
Nothing is re-embedded (a passage the source holds no token matrix for gets one
from the server's backfill).

Not copied, on purpose: the hook outcomes developers sent (`hook_outcomes`, the console's
health view). They are operational data, each developer's last few reports, which the
next `relay stats --send` renews, not team knowledge; and a run repeated after the switch
would put the SQLite server's older reports back beside those the replicas took since
(pushing newer ones out through the caps). The check leaves the table out for the same
reason (`migrate_verify.TABLES`).

Resumable: each batch is written in one transaction together with its progress
row (`migration_progress`: org, source, step, last id copied), so an
interrupted run restarts after the last committed batch; every write is an
upsert, so repeating a batch changes nothing. A finished run clears its progress,
so the next one goes over every org again and brings the target up to date
(rewriting only the passages that differ). Verifiable: row counts and a
SHA-256 over a canonical form of each table are printed for both sides, and the
command fails when any differs.

The source is read through its own connection in read-only mode, as it is: a file from
before a migration is not upgraded, and what a migration would fill in for it (the
revisions' pins) is worked out on that connection as it is read; the target is
written through the PostgreSQL store's connections, as the application role,
under row-level security, so a migration cannot write one org's rows into
another's.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import click

from relay.cli_types import StrictInt
from relay.errors import InvalidRequestError, StoreError, UnavailableError
from relay.migrate_columns import from_sqlite, insert, sqlite_time
from relay.migrate_verify import SQLITE_CACHE, changed_passages, has_tokens, render, verify

if TYPE_CHECKING:
    from relay.store.postgres import PostgresStore


def open_source(url: str) -> sqlite3.Connection:
    """The source, read-only, once it is known to be a Relay store."""
    from relay.store import database_kind, open_relay_file

    if database_kind(url) != "sqlite":
        raise InvalidRequestError("--from must be a sqlite:///path or a file path")
    conn = open_relay_file(url)
    conn.row_factory = sqlite3.Row
    _fill_in_pins(conn)
    return conn


def _fill_in_pins(src: sqlite3.Connection) -> None:
    """Give a source from before migration 8 its revisions' pins, as a server opening it
    would fill them in (`PIN_WALK`), without writing to it: in the connection's temporary
    schema, a view `memory_revisions` over the file's, which the copy and the check then
    read alike. Copied as not known, every revision of such a file lost its pin, even those
    a server would have filled in."""
    from relay.store.migrations_sqlite import PIN_WALK

    columns = {r["name"] for r in src.execute("PRAGMA main.table_info(memory_revisions)")}
    if "pinned" in columns:
        return
    src.executescript(
        "CREATE TEMP TABLE revision_pins (org_id TEXT, id TEXT, revision INTEGER,"
        " pinned INTEGER, PRIMARY KEY (org_id, id, revision)) WITHOUT ROWID;"
        f"{PIN_WALK} INSERT INTO temp.revision_pins SELECT * FROM walk;"
        " CREATE TEMP VIEW memory_revisions AS SELECT r.*, p.pinned"
        " FROM main.memory_revisions r LEFT JOIN temp.revision_pins p"
        " ON p.org_id = r.org_id AND p.id = r.id AND p.revision = r.revision;"
    )


# -- copying ---------------------------------------------------------------------
class Migration:
    def __init__(
        self,
        src: sqlite3.Connection,
        store: PostgresStore,
        source_name: str,
        batch: int = 500,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.src, self.store, self.source = src, store, source_name
        self.batch = batch
        self.say = progress or (lambda _m: None)
        self.tokens = has_tokens(src)
        self.copied = 0  # memories this run has committed, every org's

    def org_ids(self) -> list[str]:
        return [r["id"] for r in self.src.execute("SELECT id FROM orgs ORDER BY id")]

    def run(self) -> None:
        orgs = self.org_ids()
        self.check_org_names_are_free()
        for org in orgs:
            self.copy_org(org)
        self.copy_embedding_cache()
        self.forget_progress(orgs)

    def check_org_names_are_free(self) -> None:
        """Before writing anything: a target org holding a source org's name under another
        id (`relay serve` creates `default` on its first start) would stop the copy halfway."""
        taken = {o.name: o.id for o in self.store.list_orgs()}
        for o in self.src.execute("SELECT id, name FROM orgs ORDER BY name"):
            if taken.get(o["name"], o["id"]) != o["id"]:
                raise InvalidRequestError(
                    f"the target already has an organisation named {o['name']!r} of its own"
                    " (did `relay serve` run on it?): migrate into an empty database, before"
                    " the first `relay serve` on it"
                )

    def forget_progress(self, orgs: list[str]) -> None:
        """A finished pass leaves nothing to resume, so the next run copies every org again
        and brings the target up to date with whatever the source changed since."""
        for org in orgs:
            with self.store._tx(org) as conn:
                conn.execute(
                    "DELETE FROM migration_progress WHERE org_id = %s AND source = %s",
                    (org, self.source),
                )

    def _progress(self, conn: Any, org: str, step: str) -> tuple[str | None, bool]:
        row = conn.execute(
            "SELECT position, done FROM migration_progress"
            " WHERE org_id = %s AND source = %s AND step = %s",
            (org, self.source, step),
        ).fetchone()
        return (None, False) if row is None else (row["position"], row["done"])

    def _mark(self, conn: Any, org: str, step: str, position: str | None, done: bool) -> None:
        conn.execute(
            "INSERT INTO migration_progress (org_id, source, step, position, done)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (org_id, source, step) DO UPDATE"
            " SET position = excluded.position, done = excluded.done, updated_at = now()",
            (org, self.source, step, position, done),
        )

    def copy_org(self, org: str) -> None:
        o = self.src.execute("SELECT * FROM orgs WHERE id = ?", (org,)).fetchone()
        with self.store._tx(org) as conn:
            conn.execute(
                "INSERT INTO orgs (id, name, created_at) VALUES (%s, %s, %s)"
                " ON CONFLICT (id) DO UPDATE SET name = excluded.name",
                (org, o["name"], sqlite_time(o["created_at"])),
            )
            if self._progress(conn, org, "org")[1]:
                self.say(f"{o['name']}: already copied")
                return
            keys = self.src.execute("SELECT * FROM api_keys WHERE org_id = ?", (org,)).fetchall()
            for k in keys:
                conn.execute(
                    insert("api_keys") + " ON CONFLICT (id) DO UPDATE SET"
                    # A revocation is final: one made on the target since is never undone.
                    " revoked_at = coalesce(api_keys.revoked_at, excluded.revoked_at),"
                    " expires_at = excluded.expires_at",
                    from_sqlite("api_keys", k),
                )
        copied = self.copy_memories(org, o["name"])
        with self.store._tx(org) as conn:
            self.finish_org(conn, org, o)
            self._mark(conn, org, "org", None, True)
        self.say(f"{o['name']}: {copied} memories copied")

    def copy_memories(self, org: str, name: str) -> int:
        with self.store._tx(org) as conn:
            after, done = self._progress(conn, org, "memories")
        if done:
            return 0
        copied = kept = 0
        while True:
            ids = [
                r[0]
                for r in self.src.execute(
                    "SELECT id FROM memories WHERE org_id = ? AND id > ? ORDER BY id LIMIT ?",
                    (org, after or "", self.batch),
                )
            ]
            if not ids:
                break
            with self.store._tx(org) as conn:
                kept += self._copy_batch(conn, org, ids)
                after = ids[-1]
                self._mark(conn, org, "memories", after, False)
            copied += len(ids)
            self.copied += len(ids)
            self.say(f"{name}: {copied} memories")
        with self.store._tx(org) as conn:
            self._mark(conn, org, "memories", after, True)
        if kept:
            self.say(
                f"{name}: {kept} memories left as the target holds them (deleted or edited there)"
            )
        return copied

    def _copy_batch(self, conn: Any, org: str, ids: list[str]) -> int:
        """Copy these memories, but for those the target moved past since an earlier run (a
        replica deleted or edited them): a re-run would bring a deleted memory back into
        recall, or an edit's earlier text. Returns how many it left as they were."""
        memories = self.src.execute(
            f"SELECT * FROM memories WHERE org_id = ? AND id IN ({', '.join('?' for _ in ids)})",
            (org, *ids),
        ).fetchall()
        held = {
            r["id"]: r
            for r in conn.execute(
                "SELECT id, revision, deleted_at FROM memories WHERE org_id = %s AND id = ANY(%s)",
                (org, ids),
            )
        }
        moved_on = {
            m["id"]
            for m in memories
            if (t := held.get(m["id"]))
            and (t["revision"] > m["revision"] or (t["deleted_at"] and not m["deleted_at"]))
        }
        memories = [m for m in memories if m["id"] not in moved_on]
        ids = [i for i in ids if i not in moved_on]
        if not ids:
            return len(moved_on)
        marks = ", ".join("?" for _ in ids)
        args = (org, *ids)
        with conn.cursor() as cur:
            cur.executemany(
                insert("memories") + " ON CONFLICT (org_id, id) DO UPDATE SET"
                " revision = excluded.revision,"
                " title = excluded.title, body = excluded.body, source = excluded.source,"
                " tags = excluded.tags, audiences = excluded.audiences, author = excluded.author,"
                " created_at = excluded.created_at, updated_at = excluded.updated_at,"
                " valid_until = excluded.valid_until, supersedes = excluded.supersedes,"
                " superseded_by = excluded.superseded_by, pinned = excluded.pinned,"
                " deleted_at = excluded.deleted_at",
                [from_sqlite("memories", m) for m in memories],
            )
            cur.executemany(
                insert("memory_revisions")
                + " ON CONFLICT (org_id, id, revision) DO UPDATE SET title = excluded.title,"
                " body = excluded.body, pinned = excluded.pinned",
                [
                    from_sqlite("memory_revisions", r)
                    for r in self.src.execute(
                        f"SELECT * FROM memory_revisions WHERE org_id = ? AND id IN ({marks})",
                        args,
                    )
                ],
            )
            conn.execute(
                "DELETE FROM memory_audiences WHERE org_id = %s AND memory_id = ANY(%s)",
                (org, ids),
            )
            cur.executemany(
                insert("memory_audiences"),
                [
                    from_sqlite("memory_audiences", r)
                    for r in self.src.execute(
                        "SELECT * FROM memory_audiences"
                        f" WHERE org_id = ? AND memory_id IN ({marks})",
                        args,
                    )
                ],
            )
        self._copy_passages(conn, org, ids)
        return len(moved_on)

    def _copy_passages(self, conn: Any, org: str, ids: list[str]) -> None:
        """The memories' passages, each with its token matrix if it has one. A memory's
        passages are replaced whole, and only when they differ from the target's: a re-run
        then rewrites what changed alone, since every passage written costs an insertion
        into the HNSW index."""
        from relay.store.postgres import Vector, insert_passages

        tokens = (
            "t.tokens FROM passages p LEFT JOIN passage_tokens t ON t.rowid = p.rowid"
            if self.tokens
            else "NULL AS tokens FROM passages p"
        )
        passages = self.src.execute(
            f"SELECT p.*, {tokens} WHERE p.org_id = ?"
            f" AND p.memory_id IN ({', '.join('?' for _ in ids)}) ORDER BY p.memory_id, p.seq",
            (org, *ids),
        ).fetchall()
        changed = changed_passages(conn, org, ids, passages)
        if not changed:
            return
        # Their old token matrices go with them (ON DELETE CASCADE).
        conn.execute(
            "DELETE FROM passages WHERE org_id = %s AND memory_id = ANY(%s)", (org, changed)
        )
        passages = [p for p in passages if p["memory_id"] in changed]
        rows = [
            (
                org,
                p["memory_id"],
                p["revision"],
                p["seq"],
                p["text"],
                p["lexical"],
                len(p["lexical"].split()),
                p["content_hash"],
                Vector.of(p["embedding"]),
            )
            for p in passages
        ]
        with conn.cursor() as cur:
            insert_passages(cur, rows, [p["tokens"] for p in passages])

    def finish_org(self, conn: Any, org: str, o: sqlite3.Row) -> None:
        """The org's totals (its passages and tokens, each term's and each audience set's
        passages) counted on the target from what it holds, the source's copies and what
        the target took itself since an earlier run alike: copied from the source, they
        would leave out the latter. Which memory supersedes which is worked out on the target
        too, from the links of its live memories: the source's superseded_by would bring a
        memory a replica superseded since back into recall. The generation moves past the
        source's."""
        from relay.store.postgres import recount_passage_totals, relink_org_superseded

        conn.execute("SELECT 1 FROM orgs WHERE id = %s FOR UPDATE", (org,))
        relink_org_superseded(conn, org)
        recount_passage_totals(conn, org)
        conn.execute(
            "UPDATE orgs SET generation = greatest(generation, %s) + 1 WHERE id = %s",
            (o["generation"], org),
        )

    def copy_embedding_cache(self) -> int:
        copied = 0
        rows = self.src.execute(SQLITE_CACHE.format("model, content_hash, embedding"))
        while chunk := rows.fetchmany(self.batch * 4):
            with self.store._tx() as conn:
                conn.execute(
                    "INSERT INTO embedding_cache (model, content_hash, embedding)"
                    " SELECT * FROM unnest(%s::text[], %s::text[], %s::bytea[])"
                    " ON CONFLICT DO NOTHING",
                    (
                        [r["model"] for r in chunk],
                        [r["content_hash"] for r in chunk],
                        [r["embedding"] for r in chunk],
                    ),
                )
            copied += len(chunk)
        self.say(f"embedding cache: {copied} vectors")
        return copied


def _drop_vector_index_for_bulk_load(store: PostgresStore) -> None:
    """Only into an empty target: once it holds passages, searches use the index, and
    dropping it would leave them slow until a rebuild."""
    if not store.vector_index_exists():
        return  # an interrupted --defer-index run dropped it already
    if store.holds_passages():
        click.echo("keeping the vector index: the target already holds passages", err=True)
        return
    store.drop_vector_index()


def _restore_vector_index(store: PostgresStore) -> None:
    """Build the index when it is missing, whatever this run's flags: an interrupted
    --defer-index run may be resumed without the flag."""
    if store.vector_index_exists():
        return
    click.echo("building the vector index ...", err=True)
    store.build_vector_index()


@click.command("migrate")
@click.option(
    "--from", "source", required=True, help="The SQLite store to copy: sqlite:///path or a path."
)
@click.option("--to", "target", required=True, help="The PostgreSQL database: postgresql://...")
@click.option(
    "--batch",
    type=StrictInt(1, 10_000),
    default=500,
    show_default=True,
    help="Memories per transaction (and per resume point).",
)
@click.option("--verify-only", is_flag=True, help="Only compare counts and checksums.")
@click.option(
    "--defer-index",
    is_flag=True,
    help="Drop the vector index while copying and build it once at the end (much faster "
    "for large stores; searches meanwhile are exact and slower).",
)
def migrate(source: str, target: str, batch: int, verify_only: bool, defer_index: bool) -> None:
    """Copy a SQLite store into PostgreSQL: orgs, keys, memories with every revision,
    passages with their embeddings and token matrices. Resumable (re-run the same
    command) and verified by per-table counts and checksums."""
    from relay.cli.common import failed_midway  # not at the top: relay.cli imports this
    from relay.store import database_kind, postgres_store, sqlite_path

    if database_kind(target) != "postgresql":
        raise InvalidRequestError("--to must be a postgresql:// URL")
    src = open_source(source)
    try:
        store = cast("PostgresStore", postgres_store(target))
    except BaseException:
        src.close()
        raise
    try:
        if not verify_only:
            t = time.perf_counter()
            if defer_index:
                _drop_vector_index_for_bulk_load(store)
            name = str(sqlite_path(source).resolve())
            run = Migration(src, store, name, batch, lambda m: click.echo(m, err=True))
            try:
                run.run()
                _restore_vector_index(store)
            except (UnavailableError, StoreError) as exc:  # PostgreSQL stopped, say, midway
                done = f"{run.copied} memories copied by this run kept"
                raise failed_midway(exc, done, "migration") from None
            click.echo(f"copied in {time.perf_counter() - t:.1f} s", err=True)
        report = verify(src, store)
        click.echo(render(report))
        if any((a.rows, a.digest) != (b.rows, b.digest) for _, a, b in report):
            raise StoreError("the target differs from the source (see the table above)")
        click.echo("verified: every table matches")
    finally:
        store.close()
        src.close()
