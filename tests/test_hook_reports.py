"""The hook outcomes developers send (`POST /v1/hook-outcomes`), kept by the store: on both
stores, across a restart, and within their caps (`relay.models`)."""

from __future__ import annotations

from datetime import UTC, datetime

from conftest import console_health, start_server
from postgres_support import raw_count

from relay import models
from relay.models import HookHistory, HookReport

BROKEN = {
    "developer": "alice",
    "invocations": 10,
    "outcomes": {"unauthorized": 10},
    "unauthorized_streak": {"length": 10, "since": "2026-11-30T20:00:00Z"},
}


def report(key_id: str, developer: str, n: int = 0) -> HookReport:
    return HookReport(
        received_at=datetime(2026, 12, 1, 9, 0, n % 60, 123456, UTC).timestamp(),
        developer=developer,
        key_id=key_id,
        period_since="2026-11-30T00:00:00Z",
        period_until=None,
        invocations=n,
        outcomes={"hit": n, "no_match": 1, "timeout": 0},
        unauthorized_streak=n % 3,
        unauthorized_since=None,
        unavailable_streak=0,
        unavailable_since="2026-11-30T20:00:00Z",
        hook_ms={"p95": 61.5, "p50": 38.0},
        breaker="closed",
    )


def stored(store) -> int:  # noqa: ANN001
    return raw_count(store, "SELECT count(*) FROM hook_outcomes")


def streaks(r: HookReport) -> tuple[float, int, int]:
    return (r.received_at, r.unauthorized_streak, r.unavailable_streak)


def test_reports_come_back_as_sent_per_key_and_name_and_org(store):
    acme, globex = store.create_org("acme").id, store.create_org("globex").id
    sent = [report("k1", "alice", 1), report("k2", "alice", 2), report("k1", "alice", 4)]
    for r in sent:
        store.add_hook_report(acme, r)
    store.add_hook_report(globex, report("k9", "bob"))
    got = store.hook_reports(acme)
    assert got == {
        ("k1", "alice"): HookHistory(sent[2], [streaks(sent[0]), streaks(sent[2])]),
        ("k2", "alice"): HookHistory(sent[1], [streaks(sent[1])]),
    }
    # as received: field for field, and the outcomes in the order the console shows them
    assert list(got[("k1", "alice")].latest.outcomes) == ["hit", "no_match", "timeout"]
    assert list(got[("k1", "alice")].latest.hook_ms) == ["p95", "p50"]
    assert list(store.hook_reports(globex)) == [("k9", "bob")]
    assert store.hook_reports(store.create_org("initech").id) == {}


def test_reports_are_capped_per_sender_per_key_and_per_org(store):
    org = store.create_org("acme").id
    # per sender: the last REPORTS_PER_DEVELOPER, the oldest dropped
    for n in range(models.REPORTS_PER_DEVELOPER + 5):
        store.add_hook_report(org, report("k1", "alice", n))
    kept = store.hook_reports(org)[("k1", "alice")]
    assert kept.latest.invocations == models.REPORTS_PER_DEVELOPER + 4
    assert kept.streaks == [
        streaks(report("k1", "alice", n)) for n in range(5, models.REPORTS_PER_DEVELOPER + 5)
    ]
    assert stored(store) == models.REPORTS_PER_DEVELOPER

    # per key: NAMES_PER_KEY names, the least recently heard from dropped (alice spoke last)
    for n in range(models.NAMES_PER_KEY):
        store.add_hook_report(org, report("k2", f"name-{n}"))
    store.add_hook_report(org, report("k2", "name-0", 1))  # heard from again: kept
    store.add_hook_report(org, report("k2", "latecomer"))
    names = {name for key, name in store.hook_reports(org) if key == "k2"}
    assert len(names) == models.NAMES_PER_KEY
    assert "name-1" not in names and {"name-0", "latecomer"} <= names
    assert ("k1", "alice") in store.hook_reports(org)  # another key's names are untouched

    # per org: DEVELOPERS_PER_ORG senders (k2's 20 and alice are the oldest now)
    per_key = models.NAMES_PER_KEY
    for n in range(models.DEVELOPERS_PER_ORG - 21 + 10):
        store.add_hook_report(org, report(f"k{100 + n // per_key}", f"dev-{n}"))
    senders = list(store.hook_reports(org))
    assert len(senders) == models.DEVELOPERS_PER_ORG
    assert ("k1", "alice") not in senders and ("k2", "name-2") not in senders
    assert ("k2", "latecomer") in senders  # heard from after name-0: the last of k2 to go
    assert stored(store) == sum(len(h.streaks) for h in store.hook_reports(org).values())


def test_a_report_survives_a_restart_of_a_sqlite_server(tmp_path):
    """QA: reports lived in the server process's memory; a restart lost them all."""
    import httpx

    db = tmp_path / "relay.db"
    first = start_server(db)
    try:
        sent = httpx.post(
            f"{first.url}/v1/hook-outcomes",
            json=BROKEN,
            headers={"Authorization": f"Bearer {first.admin_key}"},
            timeout=30,
        )
        assert sent.status_code == 202, sent.text
        before = console_health(first.url, first.admin_key)["developers"]
        assert [d["developer"] for d in before] == ["alice"]
    finally:
        first.stop()
    second = start_server(db)
    try:
        assert console_health(second.url, first.admin_key)["developers"] == before
    finally:
        second.stop()
