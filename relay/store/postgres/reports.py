"""The hook outcomes developers send, kept for the console's health view of every replica:
the last reports of each (key, developer name), capped in the write's transaction
(`relay.models`' caps), which holds the org's row lock, so two replicas taking reports of
one org at once never both pass a cap."""

from __future__ import annotations

from datetime import UTC, datetime

from relay.models import (
    DEVELOPERS_PER_ORG,
    HOOK_REPORT_COLUMNS,
    HOOK_REPORT_JSON,
    NAMES_PER_KEY,
    REPORTS_PER_DEVELOPER,
    HookHistory,
    HookReport,
    hook_report_from_row,
    hook_report_row,
)
from relay.store.postgres.connection import PgConnection, PostgresConnections

_SENDER = "org_id = %s AND key_id = %s AND developer = %s"
_MARKS = {c: "%s::json" if c in HOOK_REPORT_JSON else "%s" for c in HOOK_REPORT_COLUMNS}


class HookOutcomes(PostgresConnections):
    """Hook reports (mixed into `PostgresStore`)."""

    def add_hook_report(self, org_id: str, report: HookReport) -> None:
        sender = (org_id, report.key_id, report.developer)
        with self._write(org_id) as conn:
            heard = conn.execute(
                f"UPDATE hook_outcomes SET latest = false WHERE {_SENDER} AND latest", sender
            ).rowcount
            conn.execute(
                f"INSERT INTO hook_outcomes (org_id, {', '.join(HOOK_REPORT_COLUMNS)}) VALUES"
                f" (%s, {', '.join(_MARKS[c] for c in HOOK_REPORT_COLUMNS)})",
                (org_id, *hook_report_row(report, datetime.fromtimestamp(report.received_at, UTC))),
            )
            conn.execute(
                f"DELETE FROM hook_outcomes WHERE {_SENDER} AND id <= (SELECT id FROM"
                f" hook_outcomes WHERE {_SENDER} ORDER BY id DESC LIMIT 1 OFFSET %s)",
                (*sender, *sender, REPORTS_PER_DEVELOPER),
            )
            if not heard:  # a new sender: past a cap, the key's or the org's oldest go
                _drop_oldest_senders(conn, org_id, report.key_id)

    def hook_reports(self, org_id: str) -> dict[tuple[str, str], HookHistory]:
        # One statement, one snapshot: each sender's latest report whole, with the streaks of
        # all its reports as one JSON array (its times as the latest's is read: epoch seconds).
        with self._tx(org_id) as conn:
            rows = conn.execute(
                "SELECT h.*, s.streaks FROM hook_outcomes h JOIN ("
                " SELECT key_id, developer, json_agg(json_build_array(extract(epoch FROM"
                " received_at), unauthorized_streak, unavailable_streak) ORDER BY id) AS streaks"
                " FROM hook_outcomes WHERE org_id = %s GROUP BY key_id, developer"
                ") s USING (key_id, developer) WHERE h.org_id = %s AND h.latest ORDER BY h.id",
                (org_id, org_id),
            ).fetchall()
        return {
            (r["key_id"], r["developer"]): HookHistory(
                hook_report_from_row(r, r["received_at"].timestamp()),
                [(float(at), u, a) for at, u, a in r["streaks"]],
            )
            for r in rows
        }


def _drop_oldest_senders(conn: PgConnection, org_id: str, key_id: str) -> None:
    """Past NAMES_PER_KEY names of `key_id`, or DEVELOPERS_PER_ORG senders in the org, the
    least recently heard from go with all their reports."""
    for query, args in (
        (
            "SELECT key_id, developer FROM hook_outcomes WHERE org_id = %s AND key_id = %s"
            " AND latest ORDER BY id DESC OFFSET %s",
            (org_id, key_id, NAMES_PER_KEY),
        ),
        (
            "SELECT key_id, developer FROM hook_outcomes WHERE org_id = %s AND latest"
            " ORDER BY id DESC OFFSET %s",
            (org_id, DEVELOPERS_PER_ORG),
        ),
    ):
        stale = conn.execute(query, args).fetchall()
        if stale:
            conn.execute(
                "DELETE FROM hook_outcomes h USING unnest(%s::text[], %s::text[]) AS s(k, d)"
                " WHERE h.org_id = %s AND h.key_id = s.k AND h.developer = s.d",
                ([r["key_id"] for r in stale], [r["developer"] for r in stale], org_id),
            )
