"""Fixtures for the dashboard: headless Chromium (Debian's `chromium`, driven by Playwright)
and a folder for the screenshots of each page."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"
CHROMIUM_CANDIDATES = ("chromium", "chromium-browser")


def chromium_path() -> str:
    """Debian's chromium (`apt-get install chromium`; `make test` installs it when missing), or MINT_TEST_CHROMIUM."""
    configured = os.environ.get("MINT_TEST_CHROMIUM")
    if configured:
        return configured
    for name in CHROMIUM_CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(
        "the dashboard tests need a Chromium: install Debian's package (`apt-get install chromium`, "
        "which `make test` does when it is missing) or point MINT_TEST_CHROMIUM at a chromium binary"
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium for the module; Playwright drives the system's binary, never a download."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=chromium_path(), headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def artifacts() -> Path:
    """Where screenshots go: test-artifacts/dashboard/ (git-ignored), emptied for each run."""
    if ARTIFACTS.exists():
        for old in ARTIFACTS.glob("*.png"):
            old.unlink()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
