"""The team console: a web page, served by the Relay server itself, where an org tends its memory.

    GET  /console                   the page (plain HTML, CSS and JavaScript from static/)
    /console/api/...                its JSON API, signed in with an API key
    POST /v1/hook-outcomes          developers' machines send aggregated hook outcomes (opt-in)

Sign-in and CSRF: the key is posted once and kept in a session cookie that is
HttpOnly (page script, and so any injected script, can never read it),
SameSite=Strict (no other site's page can make the browser send it), scoped to
/console (it never reaches /v1, which reads only the Authorization header) and
Secure over https. Every state-changing request must also carry an
`X-CSRF-Token` header, an HMAC of the key that only the signed-in page can fetch,
and come from the same origin. A bearer key held in page memory would be lost on
every reload and readable by any script that got in; the cookie is neither.
Each request re-authorizes the key, so revoking it signs the console out at once.

XSS: memory text is untrusted; the page puts it into the DOM only as text
(`textContent`, never `innerHTML`), and a strict Content-Security-Policy
(`script-src 'self'`, no inline script or style) stops anything that slips by.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

    from relay.server import Services


def mount_console(app: FastAPI, services: Services) -> None:
    """Add the console's routes to `app` and start recording recall searches for its charts."""
    from relay.console.health import attach
    from relay.console.routes import build_routers

    search_log, unrecorded_search = attach(services.searcher)
    for router in build_routers(services, search_log, unrecorded_search):
        app.include_router(router)
