"""Write the REST reference's generated parts: the OpenAPI document and a table of its routes.

`make docs` runs this before `mkdocs build`. The app is built as `mint api` builds it, on the
default settings with MINT_HOME in a temporary folder, so nothing of a real home is read or
written. Outputs (both ignored by git):

- docs/reference/openapi.json: the OpenAPI document, published with the site;
- build/docs/rest-routes.md: every route, by tag, included into docs/reference/rest.md.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPENAPI = ROOT / "docs" / "reference" / "openapi.json"
ROUTES = ROOT / "build" / "docs" / "rest-routes.md"
METHODS = ("get", "post", "put", "patch", "delete")


def routes_table(document: dict) -> str:
    """Markdown: one section per tag, one row per operation (method, path, summary)."""
    by_tag: dict[str, list[tuple[str, str, str]]] = {}
    for path, item in document["paths"].items():
        for method in METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            tag = (operation.get("tags") or ["other"])[0]
            summary = (operation.get("summary") or "").replace("|", "\\|")
            by_tag.setdefault(tag, []).append((method.upper(), path, summary))
    lines: list[str] = []
    for tag in sorted(by_tag):
        lines += [f"### {tag}", "", "| method | path | summary |", "| --- | --- | --- |"]
        lines += [f"| {m} | `{p}` | {s} |" for m, p, s in sorted(by_tag[tag], key=lambda r: (r[1], r[0]))]
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="mint-docs-") as home:
        os.environ["MINT_HOME"] = home
        sys.path.insert(0, str(ROOT))
        from mint.api.app import create_app
        from mint.config import Settings

        document = create_app(Settings()).openapi()
    OPENAPI.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
    ROUTES.parent.mkdir(parents=True, exist_ok=True)
    ROUTES.write_text(routes_table(document))
    print(f"wrote {OPENAPI.relative_to(ROOT)} ({len(document['paths'])} paths) and {ROUTES.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
