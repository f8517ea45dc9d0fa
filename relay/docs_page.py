"""GET /docs: the API's description (/openapi.json) browsable in Swagger UI, pinned.

FastAPI's own page loaded `swagger-ui-dist@5` (whatever 5.x jsDelivr called newest, unchecked)
and a favicon from fastapi.tiangolo.com, on the console's origin: a script the CDN served
could read the console's CSRF token from /console/api/session and act there as a
signed-in admin. So this page names one version of Swagger UI and the hash of each file
(Subresource Integrity: the browser runs nothing else under those names), and its
Content-Security-Policy runs no script but that file and the page's own few lines, and
sends no request but to this origin. FastAPI's helper takes no integrity attribute.
"""

from __future__ import annotations

import base64
import hashlib

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

SWAGGER_UI_VERSION = "5.35.0"
CDN = f"https://cdn.jsdelivr.net/npm/swagger-ui-dist@{SWAGGER_UI_VERSION}"
SCRIPT_URL = f"{CDN}/swagger-ui-bundle.js"
STYLE_URL = f"{CDN}/swagger-ui.css"
# sha384 of each file as published on npm, which jsDelivr serves byte for byte: from
# `npm pack swagger-ui-dist@5.35.0` (or the registry's dist.tarball, whose sha512 is
# U06rpMtW9V3XPGOBeamTUSr0Z09jMX4IJuANpE/EZbAhw0G8CgwrzU4YmXkn/h0wCDNsXdGarTNNHC3sU8yVUQ==),
# `openssl dgst -sha384 -binary package/swagger-ui-bundle.js | base64` (and swagger-ui.css).
# A new version needs both hashes computed again.
SCRIPT_SHA384 = "gjRm0bEPMeTmMh5jT2cHccIwCUZSTd8YC+j0d0sXw0MdGEfScduGpSyF3ZSSLkX9"
STYLE_SHA384 = "WlYgdmXYOOBWL5apwjDEZwN+U3HmXSSu5R6V5aGxEcf7z+KuRNwBhoxKVN1i3D5I"
FAVICON = "/console/static/favicon.svg"

# No validator badge: it is an image fetched from validator.swagger.io with the spec's URL.
BOOTSTRAP = (
    'window.ui = SwaggerUIBundle({url: "/openapi.json", dom_id: "#swagger-ui", '
    "deepLinking: true, validatorUrl: null, presets: [SwaggerUIBundle.presets.apis]});"
)
BOOTSTRAP_SHA256 = base64.b64encode(hashlib.sha256(BOOTSTRAP.encode()).digest()).decode()

# Images: the favicon, and the icons swagger-ui.css draws as data: URLs.
CSP = (
    f"default-src 'none'; script-src {SCRIPT_URL} 'sha256-{BOOTSTRAP_SHA256}'; "
    f"style-src {STYLE_URL}; img-src 'self' data:; connect-src 'self'; "
    "form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

PAGE = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Relay API</title>
<link rel="icon" href="{FAVICON}">
<link rel="stylesheet" href="{STYLE_URL}" integrity="sha384-{STYLE_SHA384}" crossorigin="anonymous">
</head>
<body>
<div id="swagger-ui"></div>
<script src="{SCRIPT_URL}" integrity="sha384-{SCRIPT_SHA384}" crossorigin="anonymous"></script>
<script>{BOOTSTRAP}</script>
</body>
</html>
"""


def mount_docs(app: FastAPI) -> None:
    """Serve the page at /docs (the app is made with FastAPI's own docs pages turned off)."""

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return HTMLResponse(PAGE, headers=HEADERS)
