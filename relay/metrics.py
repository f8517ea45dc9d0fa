"""Prometheus metrics for one server process (its own registry, so tests can build many apps)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

if TYPE_CHECKING:
    from relay.search import SearchResponse

_LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.015, 0.025, 0.05, 0.1, 0.2, 0.4, 1.0, 2.5)
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "relay_http_requests",
            "HTTP requests",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "relay_http_request_seconds",
            "HTTP request latency",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.searches = Counter(
            "relay_search",
            "Searches by outcome (hit, no_match) and path (cached, degraded, full)",
            ["outcome", "path"],
            registry=self.registry,
        )
        self.search_latency = Histogram(
            "relay_search_seconds",
            "Server-side search time",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.cache_hits = Counter(
            "relay_search_cache_hits", "Search cache hits", registry=self.registry
        )
        self.cache_entries = Gauge(
            "relay_search_cache_entries", "Cached searches", registry=self.registry
        )

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        # Any caller, keyless too, names the method: an unknown one is "other", or each
        # invented name would be a time series of its own.
        method = method if method in _METHODS else "other"
        self.requests.labels(route, method, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def observe_search(self, response: SearchResponse) -> None:
        outcome = "hit" if response.results else "no_match"
        path = "cached" if response.cached else "degraded" if response.degraded else "full"
        self.searches.labels(outcome, path).inc()
        self.search_latency.observe(response.took_ms / 1000.0)
        if response.cached:
            self.cache_hits.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
