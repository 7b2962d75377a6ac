"""The dashboard at `/ui`: a single-page app of static files shipped in `mint.dashboard`.

The page holds no secret and no data of its own: it asks the person for an API key and calls
the REST API with it, like any other client, so the dashboard can do exactly what the key's
role allows. The files are read once, at import, into a closed table of names; a request
names one of them or gets a 404, so no part of a URL ever reaches a file path.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from mint.errors import NotFound

MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# The page may load only its own files and call only its own origin.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _load_assets() -> dict[str, tuple[bytes, str]]:
    """Every file of the dashboard's `static` folder by name, with its media type."""
    folder = files("mint.dashboard") / "static"
    assets = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in MEDIA_TYPES:
            assets[entry.name] = (entry.read_bytes(), MEDIA_TYPES[suffix])
    return assets


ASSETS = _load_assets()

router = APIRouter(prefix="/ui", include_in_schema=False)


def _asset(name: str) -> Response:
    if name not in ASSETS:
        raise NotFound(f"the dashboard has no file {name!r}; open /ui/")
    body, media_type = ASSETS[name]
    return Response(body, media_type=media_type, headers=SECURITY_HEADERS)


@router.get("")
def dashboard_root() -> RedirectResponse:
    """`/ui` -> `/ui/`, so that the page's relative links resolve under `/ui/`."""
    return RedirectResponse("/ui/", status_code=308)


@router.get("/")
def dashboard_page() -> Response:
    """The page itself; every view lives behind its `#/...` fragment."""
    return _asset("index.html")


@router.get("/{name}")
def dashboard_asset(name: str) -> Response:
    """One of the page's scripts or stylesheets."""
    return _asset(name)
