"""Imports point one way (DESIGN.md section 3): the layers below never import the ones above,
and heavy frameworks stay at their edges. Checked on the source, so a new module is covered."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mint"

pytestmark = pytest.mark.backend_free

# package -> mint packages it must never import
FORBIDDEN = {
    "schemas": {"api", "worker", "storage", "services", "trainer", "evals", "cli"},
    "trainer": {"api", "worker", "storage", "services", "cli"},
    "evals": {"api", "worker", "storage", "services", "cli"},
    "storage": {"api", "worker", "services", "trainer", "evals", "cli"},
    "services": {"api", "worker", "cli"},
    # The API sends work through the `Dispatch` it is given (DESIGN.md section 3).
    "api": {"worker", "cli"},
    # The SDK speaks HTTP with the server's schemas: nothing of the server comes with it.
    "sdk": {"api", "worker", "storage", "services", "trainer", "evals", "serving", "cli", "config"},
}
# third-party modules that only their own layer may import
FRAMEWORK_HOMES = {"fastapi": {"api"}, "celery": {"worker", "cli"}, "sqlalchemy": {"storage", "services", "api"}}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def layer_of(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def test_imports_point_one_way() -> None:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        layer = layer_of(path)
        for module in imported_modules(path):
            parts = module.split(".")
            if parts[0] == "mint" and len(parts) > 1 and parts[1] in FORBIDDEN.get(layer, set()):
                problems.append(f"{path.relative_to(PACKAGE)} imports {module}")
            homes = FRAMEWORK_HOMES.get(parts[0])
            if homes is not None and layer not in homes and layer not in {"__init__", "__main__"}:
                problems.append(f"{path.relative_to(PACKAGE)} imports {parts[0]} outside {sorted(homes)}")
    assert problems == []
