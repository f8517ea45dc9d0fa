"""GET /docs on a real `relay serve`: Swagger UI pinned by version and hash, under a CSP.

QA: FastAPI's page loaded `swagger-ui-dist@5` (any 5.x, unchecked) from jsDelivr and a
favicon from fastapi.tiangolo.com, with no Content-Security-Policy, on the same origin as
the console: a script the CDN served could read the console's CSRF token and act as a
signed-in admin. The CDN is not reached here; the page and its headers are checked.
"""

from __future__ import annotations

import base64
import hashlib
import re
from html.parser import HTMLParser

import httpx
import pytest

from relay import docs_page


class Tags(HTMLParser):
    """Each start tag of a page, with its attributes, and the text of each inline script."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.inline_scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script" and "src" not in dict(attrs)

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.inline_scripts.append(data)


@pytest.fixture(scope="module")
def docs(live_server) -> httpx.Response:
    answer = httpx.get(f"{live_server.url}/docs", timeout=30)
    assert answer.status_code == 200, answer.text
    return answer


def policy(answer: httpx.Response) -> dict[str, list[str]]:
    directives = answer.headers["content-security-policy"].split(";")
    return {d.split()[0]: d.split()[1:] for d in (d.strip() for d in directives) if d}


def test_every_script_and_style_is_pinned_by_version_and_hash(docs):
    page = Tags()
    page.feed(docs.text)
    fetched = [
        (tag, attrs)
        for tag, attrs in page.tags
        if (tag == "script" and "src" in attrs) or (tag == "link" and attrs.get("rel") != "icon")
    ]
    assert {tag for tag, _ in fetched} == {"script", "link"}
    expected = {
        docs_page.SCRIPT_URL: docs_page.SCRIPT_SHA384,
        docs_page.STYLE_URL: docs_page.STYLE_SHA384,
    }
    for tag, attrs in fetched:
        url = attrs.get("src") or attrs.get("href")
        assert url in expected, url
        assert url.startswith("https://cdn.jsdelivr.net/npm/swagger-ui-dist@5.35.0/"), url
        assert attrs["integrity"] == f"sha384-{expected[url]}", tag
        assert attrs["crossorigin"] == "anonymous", tag
    for digest in expected.values():  # a sha384 in base64, as recorded in relay/docs_page.py
        assert len(base64.b64decode(digest, validate=True)) == 48
    assert "@5/" not in docs.text and "tiangolo" not in docs.text
    (icon,) = [attrs for tag, attrs in page.tags if tag == "link" and attrs.get("rel") == "icon"]
    assert icon["href"].startswith("/"), icon  # from this server, not a third party


def test_the_page_runs_no_script_but_the_pinned_one_and_its_own(docs):
    csp = policy(docs)
    assert csp["default-src"] == ["'none'"]
    page = Tags()
    page.feed(docs.text)
    (inline,) = page.inline_scripts
    inline_hash = base64.b64encode(hashlib.sha256(inline.encode()).digest()).decode()
    assert csp["script-src"] == [docs_page.SCRIPT_URL, f"'sha256-{inline_hash}'"]
    assert csp["style-src"] == [docs_page.STYLE_URL]
    assert csp["connect-src"] == ["'self'"]
    assert csp["frame-ancestors"] == ["'none'"] and csp["base-uri"] == ["'none'"]
    assert "unsafe" not in docs.headers["content-security-policy"]
    assert re.search(r"url:\s*\"/openapi.json\"", inline)  # the spec from this server


def test_framework_pages_that_load_unpinned_scripts_are_gone(live_server):
    """FastAPI's /redoc loaded `redoc@2` (floating) from jsDelivr and fonts from Google."""
    assert httpx.get(f"{live_server.url}/redoc", timeout=30).status_code == 404
    assert httpx.get(f"{live_server.url}/openapi.json", timeout=30).status_code == 200
