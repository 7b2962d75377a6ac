"""Where the SDK connects, and with which key: the API's URL (an argument, `MINT_BASE_URL`,
`MINT_API_PORT`, or the URL `mint up` wrote under `MINT_HOME`) and the API key (an argument,
`MINT_API_KEY`, or the admin key `mint up` wrote). `Mint`, `AsyncMint` and every command of
`mint` find the API this way; so can a client of its own (e.g. `mint.integrations.trl`)."""

from __future__ import annotations

import os
from pathlib import Path

from mint.sdk.errors import AuthenticationError

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
# Where `mint up` writes its API's URL, under MINT_HOME, for the CLI and SDK to find.
API_URL_FILE = "api.url"


def found_base_url(base_url: str | None) -> tuple[str, str]:
    """The API's root URL and where it was found, for messages: the argument, else
    `MINT_BASE_URL`, else the local API on `MINT_API_PORT` (the setting `mint up` reads, so a
    shell that started Mint on another port finds it), else the URL `mint up` wrote into
    `$MINT_HOME/api.url`, else the local default.

    A trailing `/v1` (as the `openai` client takes it) is accepted and dropped, since the
    SDK's paths name their version.
    """
    url_file = mint_home() / API_URL_FILE
    if base_url:
        url, source = base_url, "as given"
    elif os.environ.get("MINT_BASE_URL"):
        url, source = os.environ["MINT_BASE_URL"], "from MINT_BASE_URL"
    elif os.environ.get("MINT_API_PORT"):
        url, source = local_api_url(os.environ.get("MINT_API_HOST"), os.environ["MINT_API_PORT"]), "from MINT_API_PORT"
    elif url_file.is_file() and url_file.read_text().strip():
        url, source = url_file.read_text().strip(), f"from {url_file}, written by `mint up`"
    else:
        url, source = DEFAULT_BASE_URL, "the default: no MINT_BASE_URL, MINT_API_PORT or MINT_HOME/api.url"
    return url.strip().rstrip("/").removesuffix("/v1"), source


def local_api_url(host: str | None, port: str | int) -> str:
    """The URL a client on this machine reaches an API listening on `host:port` at: an API
    listening on every address (`0.0.0.0`, `::`) answers on the loopback one."""
    host = (host or "").strip()
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{str(port).strip()}"


def mint_home() -> Path:
    return Path(os.environ.get("MINT_HOME") or "~/.mint").expanduser()


def resolve_api_key(api_key: str | None) -> str:
    """The API key: the argument, else `MINT_API_KEY`, else `$MINT_HOME/admin.key` (written by `mint up`)."""
    key = api_key or os.environ.get("MINT_API_KEY")
    if key:
        return key.strip()
    key_file = mint_home() / "admin.key"
    if key_file.is_file():
        return key_file.read_text().strip()
    raise AuthenticationError(
        f"No API key: pass api_key=..., set MINT_API_KEY, or run `mint admin init` to write {key_file}."
    )
