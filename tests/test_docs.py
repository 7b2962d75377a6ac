"""The documentation holds together: README's and docs/'s relative links lead to files of the
repository, README stays a short front door, and every page of mkdocs.yml's nav exists.
`make docs` (run by CI) builds the site itself with strict checks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from mint.config import PROJECT_ROOT

pytestmark = pytest.mark.backend_free

DOCS = PROJECT_ROOT / "docs"
README = PROJECT_ROOT / "README.md"
# Written by docs/gen_openapi.py when `make docs` runs; ignored by git.
GENERATED = {DOCS / "reference" / "openapi.json"}
# [text](target) and [text](target "title"); images too. Code spans and fences are dropped first.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def relative_links(path: Path) -> list[str]:
    text = CODE_SPAN.sub("", FENCE.sub("", path.read_text(encoding="utf-8")))
    targets = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith(("#", "/")):
            continue  # a URL (http:, mailto:), an anchor on the same page, or a site-absolute path
        targets.append(target.split("#", 1)[0])
    return targets


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(PROJECT_ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    broken = []
    for target in relative_links(path):
        resolved = (path.parent / target).resolve()
        if resolved in GENERATED:
            continue
        if not resolved.exists() or not resolved.is_relative_to(PROJECT_ROOT):
            broken.append(target)
    assert not broken, f"{path.relative_to(PROJECT_ROOT)} links to missing files: {broken}"


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines < 150, f"README.md has {lines} lines; move detail into docs/"


def nav_pages(node: object) -> list[str]:
    """Every file named in an mkdocs nav, however nested."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [page for item in node for page in nav_pages(item)]
    if isinstance(node, dict):
        return [page for value in node.values() for page in nav_pages(value)]
    return []


def test_every_nav_page_exists() -> None:
    # mkdocs.yml names a Python function for mermaid fences (a !!python/name tag): load it as data.
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    config = yaml.load((PROJECT_ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)
    pages = nav_pages(config["nav"])
    assert pages, "mkdocs.yml has no nav"
    missing = [page for page in pages if not (DOCS / page).is_file()]
    assert not missing, f"mkdocs.yml's nav names missing pages: {missing}"
    unlisted = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if str(p.relative_to(DOCS)) not in pages)
    assert not unlisted, f"pages in docs/ that the nav does not list: {unlisted}"
