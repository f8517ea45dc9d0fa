"""The CLI's client knows every route of the API it talks to.

`relay.client` checks each answer against its table of Relay's routes (which keys the
answer holds, whether the request writes): an answer to an unlisted route is not checked,
and a failed request to it is said to maybe have written. A route added to the server
without a row in that table would silently lose both, so the two are compared here.
"""

from __future__ import annotations

import re

import pytest

from relay import client
from relay.server import create_app


def _api_routes(api) -> list[tuple[str, str]]:
    """(method, path) of every JSON route the API documents for clients (its OpenAPI
    description, which the console's ingest route is in too), with `{x}` filled in."""
    paths = create_app(api.services).openapi()["paths"]
    return [
        (method.upper(), re.sub(r"\{[^}]+\}", "m_3f9a0c", path))
        for path, operations in paths.items()
        if path.startswith(("/v1/", "/healthz"))
        for method in operations
    ]


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_every_api_route_is_in_the_clients_table(api) -> None:
    routes = _api_routes(api)
    assert ("POST", "/v1/hook-outcomes") in routes  # the console's routes are seen too
    unlisted = [(m, p) for m, p in routes if client._route(m, p)[0] == ()]
    assert unlisted == [], "add these to relay.client._ROUTES"
    said_to_write = [(m, p) for m, p in routes if m == "GET" and client._route(m, p)[1]]
    assert said_to_write == []


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_every_row_of_the_clients_table_is_a_route_of_the_api(api) -> None:
    routes = _api_routes(api)
    stale = [
        (method, pattern.pattern)
        for method, pattern, _, _ in client._ROUTES
        if not any(m == method and pattern.fullmatch(p) for m, p in routes)
    ]
    assert stale == []
