"""Recall's health for one organisation: searches over time and the hook outcomes developers send.

Searches live in this process only (a bounded ring of recent searches), so on several
replicas each shows what it served since it started; the console says so. The hook
outcomes developers send are kept by the store (`Store.add_hook_report`), so every
replica shows them all and a restart keeps them; this module only reads them into rows.
Nothing here holds memory text or prompts: a search is remembered as its org, key,
timings, flags and result ids.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from relay.models import HookHistory, Principal

if TYPE_CHECKING:
    from relay.search import Searcher, SearchResponse

SEARCH_EVENTS_MAX = 20_000
UNAVAILABLE_STREAK_ALERT = 3  # as relay.hook_stats: below this a blip, not a broken install


@dataclass(frozen=True)
class SearchEvent:
    at: float  # epoch seconds
    org_id: str
    key_id: str
    took_ms: float
    deadline_ms: float
    hit: bool
    cached: bool
    degraded: bool
    result_ids: tuple[str, ...]


class SearchLog:
    """The recent searches of every org served by this process, and recall counts per memory."""

    def __init__(self, max_events: int = SEARCH_EVENTS_MAX) -> None:
        self.started_at = time.time()
        self._events: deque[SearchEvent] = deque(maxlen=max_events)
        self._recalls: dict[str, Counter[str]] = {}
        self._lock = threading.Lock()

    def record(self, principal: Principal, response: SearchResponse, deadline_ms: float) -> None:
        ids = tuple(dict.fromkeys(h.id for h in response.results))
        event = SearchEvent(
            time.time(),
            principal.org_id,
            principal.key_id,
            float(response.took_ms),
            float(deadline_ms),
            bool(response.results),
            response.cached,
            response.degraded,
            ids,
        )
        with self._lock:
            self._events.append(event)
            self._recalls.setdefault(principal.org_id, Counter()).update(ids)

    def events(self, org_id: str, since: float) -> list[SearchEvent]:
        with self._lock:
            return [e for e in self._events if e.org_id == org_id and e.at >= since]

    def recalls(self, org_id: str) -> Counter[str]:
        with self._lock:
            return Counter(self._recalls.get(org_id, {}))


_LOGS: weakref.WeakKeyDictionary[Searcher, SearchLog] = weakref.WeakKeyDictionary()


def attach(searcher: Searcher) -> tuple[SearchLog, Callable[..., SearchResponse]]:
    """Record every recall search `searcher` answers (API, MCP); return the log and the
    unrecorded search, which the console's own queries use so they never count as recall.

    Attaching twice (two apps over one Services) reuses the first log instead of
    counting each search twice.
    """
    if searcher in _LOGS:
        return _LOGS[searcher], searcher.search.__wrapped__  # type: ignore[attr-defined]
    log = SearchLog()
    inner = searcher.search

    def search(
        principal: Principal,
        query: str,
        k: int = 5,
        deadline_ms: float = 1000.0,
        mode: Any = "hybrid",
        use_cache: bool = True,
        until: float | None = None,
    ) -> SearchResponse:
        response = inner(principal, query, k, deadline_ms, mode, use_cache, until)
        log.record(principal, response, deadline_ms)
        return response

    search.__wrapped__ = inner  # type: ignore[attr-defined]
    searcher.search = search  # type: ignore[method-assign]
    _LOGS[searcher] = log
    return log, inner


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (as `relay stats`); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, math.ceil(p * len(ordered)) - 1)], 2)


def search_series(events: list[SearchEvent], since: float, until: float, buckets: int) -> dict:
    """Searches bucketed over [since, until): counts, outcomes, latency percentiles, cache rate."""
    width = max(1.0, (until - since) / buckets)
    rows: list[dict[str, Any]] = []
    for i in range(buckets):
        start = since + i * width
        inside = [e for e in events if start <= e.at < start + width]
        took = [e.took_ms for e in inside]
        rows.append(
            {
                "start": start,
                "searches": len(inside),
                "hit": sum(e.hit for e in inside),
                "no_match": sum(not e.hit for e in inside),
                "degraded": sum(e.degraded for e in inside),
                "cached": sum(e.cached for e in inside),
                "p50": percentile(took, 0.50),
                "p95": percentile(took, 0.95),
                "p99": percentile(took, 0.99),
            }
        )
    took = [e.took_ms for e in events]
    deadlines = [e.deadline_ms for e in events]
    total = len(events)
    return {
        "since": since,
        "until": until,
        "bucket_s": width,
        "buckets": rows,
        "total": {
            "searches": total,
            "hit": sum(e.hit for e in events),
            "no_match": sum(not e.hit for e in events),
            "degraded": sum(e.degraded for e in events),
            "cached": sum(e.cached for e in events),
            "cache_hit_rate": round(sum(e.cached for e in events) / total, 4) if total else None,
            "p50": percentile(took, 0.50),
            "p95": percentile(took, 0.95),
            "p99": percentile(took, 0.99),
        },
        # The deadline callers asked for (the hook sends its remaining budget): the median.
        "deadline_ms": percentile(deadlines, 0.50) if deadlines else None,
    }


# -- hook outcomes that developers opt in to send (kept by the store) ---------------
def streak_rows(
    reports: dict[tuple[str, str], HookHistory], key_names: dict[str, str]
) -> list[dict[str, Any]]:
    """Per key and developer: the latest streaks, their history, and whether it means a
    broken install; with the name of the key that sent them (the developer's name is the
    sender's own word)."""
    rows = []
    for (key_id, name), kept in reports.items():
        last = kept.latest
        problems = []
        if last.unauthorized_streak:
            problems.append("unauthorized")
        if last.unavailable_streak >= UNAVAILABLE_STREAK_ALERT:
            problems.append("unavailable")
        rows.append(
            {
                "developer": name,
                "key_id": key_id,
                "key_name": key_names.get(key_id),
                "latest": last.to_dict(),
                "history": [
                    {"at": at, "unauthorized": unauthorized, "unavailable": unavailable}
                    for at, unauthorized, unavailable in kept.streaks
                ],
                "broken": problems,
            }
        )
    rows.sort(key=lambda r: (not r["broken"], r["developer"], r["key_id"]))
    return rows


def most_recalled(counts: Counter[str], visible: Iterable[str], n: int) -> list[tuple[str, int]]:
    wanted = set(visible)
    return [(mid, c) for mid, c in counts.most_common() if mid in wanted][:n]
