"""Imports point one way (DESIGN.md section 3): the layers below never import the ones above,
no two Mint packages import each other, and heavy frameworks stay at their edges. Checked on
the source, every import statement counted (function-level and TYPE_CHECKING ones included),
so a new module is covered."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mint"

pytestmark = pytest.mark.backend_free

# The top-level packages and modules of mint/ (mint/__init__.py and __main__.py are the root, not a layer).
LAYERS = frozenset(
    path.name.removesuffix(".py")
    for path in PACKAGE.iterdir()
    if (path.is_dir() and (path / "__init__.py").exists())
    or (path.suffix == ".py" and path.name not in {"__init__.py", "__main__.py"})
)
# The bottom of the stack: every layer may import these.
BASE = {"errors", "config"}


def everything_but(*allowed: str) -> set[str]:
    """Every layer except `allowed` and the base; a new package is forbidden until allowed."""
    return set(LAYERS) - BASE - set(allowed)


# package -> mint packages it must never import
FORBIDDEN = {
    # Pure text and JSON under trainer, evals and serving; wire types under api, sdk and cli.
    "chat": everything_but("chat"),
    "schemas": everything_but("schemas"),
    "storage": {"api", "worker", "services", "trainer", "evals", "serving", "cli"},
    "services": {"api", "worker", "cli"},
    # trainer and evals are peers above chat: the RL recipe takes its graders from its caller.
    "trainer": {"api", "worker", "storage", "services", "evals", "serving", "cli"},
    # evals may use trainer's torch-free vocabulary only (see ONLY_THROUGH), never the reverse.
    "evals": {"api", "worker", "storage", "services", "serving", "cli"},
    "serving": {"api", "worker", "services", "evals", "cli"},
    "worker": {"api", "cli"},
    # The API sends work through the `Dispatch` it is given (DESIGN.md section 3); it reads a serving
    # node through its wire types (`mint.schemas.node`), never through `mint.serving`.
    "api": {"worker", "trainer", "serving", "sdk", "cli"},
    # The SDK speaks HTTP with the server's schemas: nothing of the server comes with it.
    "sdk": {"api", "worker", "storage", "services", "trainer", "evals", "serving", "chat", "cli", "config"},
    # A team's own code on the client side (its TRL script, `mint reward-server`): it reaches Mint
    # through the SDK and the wire types like any client, never through the server's packages.
    "integrations": everything_but("integrations", "sdk", "schemas"),
}
# package -> the only mint packages that may import it
IMPORTED_ONLY_BY = {
    # Client-side code runs in a team's process; `mint reward-server` is the one command that runs it.
    "integrations": {"cli"},
}
# (package, package it may import) -> the only modules of the second it may import
ONLY_THROUGH = {
    # SamplerGenerate drives a resident base with trainer's SamplingParams; nothing with torch.
    ("evals", "trainer"): {"mint.trainer.types"},
}
# third-party modules that only their own layer may import
FRAMEWORK_HOMES = {"fastapi": {"api"}, "celery": {"worker", "cli"}, "sqlalchemy": {"storage", "services", "api"}}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_mint_module(module: str) -> bool:
    path = PACKAGE.parent.joinpath(*module.split("."))
    return module.startswith("mint.") and (path.with_suffix(".py").is_file() or (path / "__init__.py").is_file())


def imported_modules(path: Path, tree: ast.Module | None = None) -> set[str]:
    """Every module `path` (or `tree`, a part of it) imports, absolute; `from mint import errors`
    counts as `mint.errors`."""
    tree = tree or ast.parse(path.read_text(), filename=str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            names.add(module)
            # `from mint.package import submodule` imports the submodule.
            names.update(f"{module}.{alias.name}" for alias in node.names if is_mint_module(f"{module}.{alias.name}"))
    return names


def layer_of(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def mint_layer(module: str) -> str | None:
    """The layer a module belongs to, or None when it is not part of one (third party, `mint.__version__`)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "mint" and len(parts) > 1 and parts[1] in LAYERS else None


def package_graph() -> dict[str, dict[str, list[str]]]:
    """layer -> layer it imports -> the import sites (`file imports module`)."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(PACKAGE.rglob("*.py")):
        source = layer_of(path)
        if source not in LAYERS:
            continue
        for module in sorted(imported_modules(path)):
            target = mint_layer(module)
            if target is not None and target != source:
                graph[source][target].append(f"{path.relative_to(PACKAGE)} imports {module}")
    return graph


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph as [a, b, ..., a], or None when it has none."""
    state: dict[str, str] = {}  # "open" while on the DFS stack, then "done"
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == "open":
                return [*stack[stack.index(target) :], target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_imports_point_one_way() -> None:
    assert set(FORBIDDEN) <= LAYERS and all(forbidden <= LAYERS for forbidden in FORBIDDEN.values())
    assert set(IMPORTED_ONLY_BY) <= LAYERS and all(importers <= LAYERS for importers in IMPORTED_ONLY_BY.values())
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        layer = layer_of(path)
        for module in sorted(imported_modules(path)):
            target = mint_layer(module)
            if target in FORBIDDEN.get(layer, set()):
                problems.append(f"{path.relative_to(PACKAGE)} imports {module}")
            importers = IMPORTED_ONLY_BY.get(target or "")
            if importers is not None and layer != target and layer not in importers:
                problems.append(f"{path.relative_to(PACKAGE)} imports {module}; only {sorted(importers)} may")
            only = ONLY_THROUGH.get((layer, target or ""))
            if (
                only is not None
                and module != f"mint.{target}"
                and not any(module == o or module.startswith(f"{o}.") for o in only)
            ):
                problems.append(f"{path.relative_to(PACKAGE)} imports {module}; {layer} may import only {sorted(only)}")
            homes = FRAMEWORK_HOMES.get(module.split(".")[0])
            if homes is not None and layer not in homes and layer not in {"__init__", "__main__"}:
                problems.append(f"{path.relative_to(PACKAGE)} imports {module.split('.')[0]} outside {sorted(homes)}")
    assert problems == []


def test_no_two_packages_import_each_other() -> None:
    graph = package_graph()
    cycle = find_cycle({source: set(targets) for source, targets in graph.items()})
    if cycle is not None:
        sites = [f"{a} -> {b}: {graph[a][b][0]}" for a, b in zip(cycle, cycle[1:], strict=False)]
        pytest.fail("package import cycle " + " -> ".join(cycle) + "\n" + "\n".join(sites))


def test_find_cycle() -> None:
    assert find_cycle({"api": {"services"}, "services": {"storage"}}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"b", "c"}}) == ["b", "b"]
    assert find_cycle({"x": {"y"}, "y": set(), "evals": {"trainer"}, "trainer": {"evals"}}) == [
        "evals",
        "trainer",
        "evals",
    ]


# ---- files and the services' rooms --------------------------------------------------------------

# mint/services, top first: a room may import only the rooms below it (and, inside a package,
# its own modules). The kernel is every top-level module of services/ but the catalog, the
# shared read layer at the bottom through which a use case reads another's rows.
SERVICE_ROOMS: tuple[frozenset[str], ...] = (
    frozenset({"autotune", "upkeep"}),
    frozenset({"jobs"}),
    frozenset({"evals"}),
    frozenset({"tinker"}),
    frozenset({"serving"}),
    frozenset({"models"}),
    frozenset({"billing"}),
    frozenset({"webhooks"}),
    frozenset({"kernel"}),
    frozenset({"catalog"}),
)
SERVICES = PACKAGE / "services"


def module_of(imported: str) -> str | None:
    """The Mint module (file) an imported name lives in: `mint.a.b.name` -> `mint.a.b`."""
    while imported.startswith("mint.") and not is_mint_module(imported):
        imported = imported.rpartition(".")[0]
    return imported if imported.startswith("mint.") else None


def file_graph() -> dict[str, dict[str, int]]:
    """module -> Mint module it imports -> the line of the first such import, every import
    counted (inside functions and under TYPE_CHECKING too)."""
    graph: dict[str, dict[str, int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        source = module_name(path)
        edges = graph.setdefault(source, {})
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for imported in imported_modules_of(node, path):
                target = module_of(imported)
                if target is not None and target not in {source, "mint"}:
                    edges.setdefault(target, node.lineno)
    return graph


def imported_modules_of(node: ast.Import | ast.ImportFrom, path: Path) -> set[str]:
    """The modules one import statement imports (as `imported_modules` reads a whole file)."""
    module = ast.Module(body=[node], type_ignores=[])
    return imported_modules(path, tree=module)


def service_room(module: str) -> str | None:
    """The room of a module under mint/services: its package, `catalog`, or `kernel`."""
    parts = module.split(".")
    if parts[:2] != ["mint", "services"] or len(parts) < 3:
        return None
    if (SERVICES / parts[2]).is_dir():
        return parts[2]
    return "catalog" if parts[2] == "catalog" else "kernel"


def test_no_file_imports_itself_back() -> None:
    """No circle of files anywhere in mint/, imports inside functions included: a circle held
    open by a function-level import is a circle all the same."""
    graph = file_graph()
    cycle = find_cycle({source: set(targets) for source, targets in graph.items()})
    if cycle is not None:
        sites = [f"{a} line {graph[a][b]} imports {b}" for a, b in zip(cycle, cycle[1:], strict=False)]
        pytest.fail("file import circle " + " -> ".join(cycle) + "\n" + "\n".join(sites))


def test_services_rooms_point_down() -> None:
    rank = {room: index for index, rooms in enumerate(SERVICE_ROOMS) for room in rooms}
    packages = {path.name for path in SERVICES.iterdir() if (path / "__init__.py").is_file()}
    assert packages <= set(rank), f"place the new services packages {sorted(packages - set(rank))} in SERVICE_ROOMS"
    problems = []
    for source, targets in file_graph().items():
        room = service_room(source)
        for target, line in targets.items():
            target_room = service_room(target)
            if room is None or target_room is None or target_room == room:
                continue
            if rank[target_room] <= rank[room]:
                problems.append(f"{source} line {line} imports {target}: {room} may import only the rooms below it")
    assert problems == []


def test_services_import_each_other_at_the_top_of_the_file() -> None:
    """A function-level import of one services module by another only hides a circle (the
    rooms point down, so there is nothing to wait for): imports of services are module-level.
    Lazy imports of trainer, evals or serving (torch) inside worker-side modules stay allowed."""
    problems = []
    for path in sorted(SERVICES.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Import | ast.ImportFrom) and any(
                    name.startswith("mint.services") for name in imported_modules_of(node, path)
                ):
                    problems.append(
                        f"{path.relative_to(PACKAGE)} line {node.lineno} imports services inside a function"
                    )
    assert problems == []
