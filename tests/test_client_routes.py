"""The CLI's client knows every route of the API it talks to.

`relay.client` checks each answer against its table of Relay's routes (which keys the
answer holds, whether the request writes): an answer to an unlisted route is not checked,
and a failed request to it is said to maybe have written. A route added to the server
without a row in that table would silently lose both, so the two are compared here.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from integration_support import relay, serving

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
        for method, pattern, _ in client._ROUTES
        if not any(m == method and pattern.fullmatch(p) for m, p in routes)
    ]
    assert stale == []


@contextlib.contextmanager
def fat_server(size: int, declared: bool) -> Iterator[str]:
    """A server on loopback answering every request with `size` bytes of JSON in Relay's
    shapes, its Content-Length `declared` or the body ended by closing the connection."""
    row = json.dumps({"id": "mem_0123456789abcdef", "text": "x" * 1000}).encode()
    rows = b",".join([row] * (size // (len(row) + 1) + 1))
    body = b'{"results": [], "next_cursor": null, "items": [' + rows + b"]}"

    class Fat(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if declared:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with contextlib.suppress(OSError):  # the client stops reading: that is the point
                self.wfile.write(body)

        do_GET = do_POST = answer

        def log_message(self, *args: object) -> None:
            pass

    with serving(Fat) as url:
        yield url


@pytest.mark.parametrize("declared", [True, False])
def test_an_answer_larger_than_relay_sends_is_refused_unread(tmp_path: Path, declared: bool):
    """QA: the client read any answer whole: a 50 MB one took `relay mcp` to ~570 MB. A
    search answer is at most MAX_K passages; past ANSWER_BYTES it is one line naming the
    server and the limit, whether the size was declared or not."""
    with fat_server(client.ANSWER_BYTES + 1024, declared) as url:
        done = relay(tmp_path, "search", "anything at all", "--url", url, "--key", "relay_k_s")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (
        f"relay: error: the server at {url} sent an answer over 8 MiB to POST /v1/search, more"
        " than any Relay server sends to it: not read (is another server or a proxy at that"
        " URL?)\n"
    )


def test_a_list_may_be_larger_than_one_memory_but_is_capped_too():
    """`relay export` reads pages of 500 memories, up to some 50 MB: a list is read under
    the larger LIST_ANSWER_BYTES, so a page over ANSWER_BYTES still comes through."""
    assert client.answer_bytes("GET", "/v1/memories?limit=500") == client.LIST_ANSWER_BYTES
    assert client.answer_bytes("POST", "/v1/search") == client.ANSWER_BYTES
    with fat_server(client.ANSWER_BYTES * 2, declared=False) as url:
        page = client.RelayClient(url, "relay_k_s").get("/v1/memories?limit=500")
        assert len(page["items"]) > 2 * client.ANSWER_BYTES // 1100
        with pytest.raises(client.AnswerTooLargeError, match="over 8 MiB to GET /v1/memories/m"):
            client.RelayClient(url, "relay_k_s").get("/v1/memories/mem_0123456789abcdef")


def test_a_long_history_or_profile_is_read_whatever_its_size(monkeypatch):
    """A memory's revisions and the pinned profile have no count bound: 2,100 revisions of a
    full-size body came to 135 MB from a real server, and `relay history` refused them as
    'more than any Relay server sends'. They are read whole; a page of a list still is not
    (LIST_ANSWER_BYTES is made small here so the answers stay a few MB)."""
    monkeypatch.setattr(client, "LIST_ANSWER_BYTES", client.ANSWER_BYTES * 2)
    with fat_server(client.ANSWER_BYTES * 3, declared=True) as url:
        relay_client = client.RelayClient(url, "relay_k_s")
        history = relay_client.get("/v1/memories/mem_0123456789abcdef/revisions")
        assert len(history["items"]) > 3 * client.ANSWER_BYTES // 1100
        assert relay_client.get("/v1/profile")["results"] == []
        with pytest.raises(client.AnswerTooLargeError, match="over 16 MiB to GET /v1/memories"):
            relay_client.get("/v1/memories?limit=500")


def test_a_redirect_is_refused_and_the_key_goes_nowhere_else(tmp_path: Path):
    """QA: urllib followed a redirect wherever it pointed, with the Authorization header:
    a server (or a proxy before it, an SSO gateway sending callers to its login host) that
    answered 302 to another host got the key sent there, a search's POST going on as a GET.
    A Relay server never redirects: the CLI says where it was sent, and goes no further."""
    seen: list[str | None] = []

    class Elsewhere(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        do_POST = do_GET

        def log_message(self, *args: object) -> None:
            pass

    key = "relay_0a1b2c3d4e5f_secret-part-of-the-key-0000"
    with serving(Elsewhere) as elsewhere:
        target = elsewhere.replace("127.0.0.1", "localhost") + "/login"

        class Redirecting(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(302)
                self.send_header("Location", target)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_POST = do_GET

            def log_message(self, *args: object) -> None:
                pass

        with serving(Redirecting) as url:
            for args in (["search", "anything at all"], ["history", "mem_0123456789abcdef"]):
                done = relay(tmp_path, *args, "--url", url, "--key", key)
                assert seen == []  # the key never reached the other host
                assert done.returncode != 0 and "secret-part" not in done.stdout + done.stderr
                assert f"got 302, a redirect to {target}; give the root URL" in done.stderr
