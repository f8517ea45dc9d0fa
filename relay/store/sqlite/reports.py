"""The hook outcomes developers send, kept for the console's health view: the last reports
of each (key, developer name), capped in the write's transaction (`relay.models`' caps)."""

from __future__ import annotations

import sqlite3

from relay.models import (
    DEVELOPERS_PER_ORG,
    HOOK_REPORT_COLUMNS,
    NAMES_PER_KEY,
    REPORTS_PER_DEVELOPER,
    HookHistory,
    HookReport,
    hook_report_from_row,
    hook_report_row,
)
from relay.store.sqlite.connection import SQLiteConnections

_SENDER = "org_id = ? AND key_id = ? AND developer = ?"


class HookOutcomes(SQLiteConnections):
    """Hook reports (mixed into `SQLiteStore`)."""

    def add_hook_report(self, org_id: str, report: HookReport) -> None:
        sender = (org_id, report.key_id, report.developer)
        with self._write() as conn:
            heard = conn.execute(
                f"UPDATE hook_outcomes SET latest = 0 WHERE {_SENDER} AND latest", sender
            ).rowcount
            conn.execute(
                f"INSERT INTO hook_outcomes (org_id, {', '.join(HOOK_REPORT_COLUMNS)})"
                f" VALUES (?{', ?' * len(HOOK_REPORT_COLUMNS)})",
                (org_id, *hook_report_row(report, report.received_at)),
            )
            conn.execute(
                f"DELETE FROM hook_outcomes WHERE {_SENDER} AND id <= (SELECT id FROM"
                f" hook_outcomes WHERE {_SENDER} ORDER BY id DESC LIMIT 1 OFFSET ?)",
                (*sender, *sender, REPORTS_PER_DEVELOPER),
            )
            if not heard:  # a new sender: past a cap, the key's or the org's oldest go
                _drop_oldest_senders(conn, org_id, report.key_id)

    def hook_reports(self, org_id: str) -> dict[tuple[str, str], HookHistory]:
        with self._read() as conn:
            latest = conn.execute(
                "SELECT * FROM hook_outcomes WHERE org_id = ? AND latest ORDER BY id", (org_id,)
            ).fetchall()
            streaks: dict[tuple[str, str], list[tuple[float, int, int]]] = {}
            for r in conn.execute(
                "SELECT key_id, developer, received_at, unauthorized_streak, unavailable_streak"
                " FROM hook_outcomes WHERE org_id = ? ORDER BY id",
                (org_id,),
            ):
                streaks.setdefault((r[0], r[1]), []).append((r[2], r[3], r[4]))
        return {
            (r["key_id"], r["developer"]): HookHistory(
                hook_report_from_row(r, r["received_at"]), streaks[(r["key_id"], r["developer"])]
            )
            for r in latest
        }


def _drop_oldest_senders(conn: sqlite3.Connection, org_id: str, key_id: str) -> None:
    """Past NAMES_PER_KEY names of `key_id`, or DEVELOPERS_PER_ORG senders in the org, the
    least recently heard from go with all their reports."""
    for query, args in (
        (
            "SELECT key_id, developer FROM hook_outcomes WHERE org_id = ? AND key_id = ?"
            " AND latest ORDER BY id DESC LIMIT -1 OFFSET ?",
            (org_id, key_id, NAMES_PER_KEY),
        ),
        (
            "SELECT key_id, developer FROM hook_outcomes WHERE org_id = ? AND latest"
            " ORDER BY id DESC LIMIT -1 OFFSET ?",
            (org_id, DEVELOPERS_PER_ORG),
        ),
    ):
        stale = [(org_id, r["key_id"], r["developer"]) for r in conn.execute(query, args)]
        conn.executemany(f"DELETE FROM hook_outcomes WHERE {_SENDER}", stale)
