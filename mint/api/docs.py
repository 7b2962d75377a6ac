"""The API reference at `/docs`: Swagger UI served from this process, never from a CDN.

Swagger UI's files come from the `swagger-ui-bundle` package; a request names one of a
closed table of them or gets a 404, so no part of a URL reaches a file path. (FastAPI's own
`/docs` and `/redoc` load their scripts from a CDN, so `create_app` turns both off.)
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, Response
from swagger_ui_bundle import swagger_ui_path

from mint.errors import NotFound

ASSET_PREFIX = "/docs/assets"
ASSET_MEDIA_TYPES = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon-32x32.png": "image/png",
}
# Scripts from this origin only, and the page's one inline script (which starts Swagger UI) by
# its hash; Swagger UI sets inline styles.
CSP = (
    "default-src 'none'; script-src 'self' '{script_hash}'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)

router = APIRouter(include_in_schema=False)


@cache
def _asset_bytes(name: str) -> bytes:
    return (swagger_ui_path / name).read_bytes()


@router.get("/docs")
def swagger_ui(request: Request) -> HTMLResponse:
    """Swagger UI on this API's OpenAPI document."""
    page = get_swagger_ui_html(
        openapi_url=request.app.openapi_url,
        title=f"{request.app.title} API",
        swagger_js_url=f"{ASSET_PREFIX}/swagger-ui-bundle.js",
        swagger_css_url=f"{ASSET_PREFIX}/swagger-ui.css",
        swagger_favicon_url=f"{ASSET_PREFIX}/favicon-32x32.png",
        oauth2_redirect_url="/docs/oauth2-redirect",
    )
    inline = INLINE_SCRIPT.search(bytes(page.body).decode())
    script_hash = (
        "sha256-" + base64.b64encode(hashlib.sha256((inline.group(1) if inline else "").encode()).digest()).decode()
    )
    page.headers.update(
        {
            "Content-Security-Policy": CSP.format(script_hash=script_hash),
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
        }
    )
    return page


@router.get("/docs/oauth2-redirect")
def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get(ASSET_PREFIX + "/{name}")
def swagger_ui_asset(name: str) -> Response:
    """One of Swagger UI's files."""
    if name not in ASSET_MEDIA_TYPES:
        raise NotFound(f"the API reference has no file {name!r}; open /docs")
    headers = {"Cache-Control": "public, max-age=86400", "X-Content-Type-Options": "nosniff"}
    return Response(_asset_bytes(name), media_type=ASSET_MEDIA_TYPES[name], headers=headers)
