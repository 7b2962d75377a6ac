"""Where the CLI and SDK look for the platform: MINT_BASE_URL, else the local API on
MINT_API_PORT (what `mint up` reads), else the URL `mint up` wrote into MINT_HOME, else the
default; and a connection error says which it used."""

from __future__ import annotations

from pathlib import Path

import pytest

from mint.sdk import Mint
from mint.sdk._http import API_URL_FILE, found_base_url
from mint.sdk.errors import APIConnectionError
from tests.conftest import free_port

pytestmark = pytest.mark.backend_free


@pytest.fixture
def bare(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An environment that names no platform, with an empty MINT_HOME."""
    for name in ("MINT_BASE_URL", "MINT_API_PORT", "MINT_API_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MINT_HOME", str(tmp_path))
    return tmp_path


def test_each_source_in_its_order(bare: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert found_base_url(None) == (
        "http://127.0.0.1:8000",
        "the default: no MINT_BASE_URL, MINT_API_PORT or MINT_HOME/api.url",
    )
    (bare / API_URL_FILE).write_text("http://127.0.0.1:23001\n")
    assert found_base_url(None) == ("http://127.0.0.1:23001", f"from {bare / API_URL_FILE}, written by `mint up`")
    monkeypatch.setenv("MINT_API_PORT", "22014")
    assert found_base_url(None) == ("http://127.0.0.1:22014", "from MINT_API_PORT")
    monkeypatch.setenv("MINT_API_HOST", "0.0.0.0")  # listening everywhere: reached on the loopback address
    assert found_base_url(None)[0] == "http://127.0.0.1:22014"
    monkeypatch.setenv("MINT_API_HOST", "::1")
    assert found_base_url(None)[0] == "http://[::1]:22014"
    monkeypatch.setenv("MINT_BASE_URL", "https://mint.example.com/v1/")
    assert found_base_url(None) == ("https://mint.example.com", "from MINT_BASE_URL")
    assert found_base_url("http://10.0.0.5:8000") == ("http://10.0.0.5:8000", "as given")


def test_a_connection_error_says_where_the_url_came_from(bare: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()  # nothing listens there
    monkeypatch.setenv("MINT_API_PORT", str(port))
    client = Mint(api_key="unused", max_retries=0)
    with pytest.raises(APIConnectionError) as raised:
        list(client.jobs.list())
    message = str(raised.value)
    assert f"http://127.0.0.1:{port} (from MINT_API_PORT)" in message and "mint up" in message, message
