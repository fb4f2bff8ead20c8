"""The package trees keep their shape: imports point down the layers, no import cycles, small modules.

Both `replicator/` and `operator/` (`replication_operator`) are layered; the operator may import the
data plane, never the other way round.

Read from the source with `ast` (function-level imports included), so a lazy import cannot hide a
cycle or an upward dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"replicator": ROOT / "replicator", "replication_operator": ROOT / "operator"}

# Bottom to top: a sub-package may import its own modules and those of lower layers only.
LAYERS: list[set[str]] = [
    {"config"},
    {"observe"},
    {"transport"},
    {"sampling"},
    {"copier", "fleet_health", "heartbeats"},
    {"service"},
    {"demo"},
    {"cli"},
]
RANK = {package: rank for rank, layer in enumerate(LAYERS) for package in layer}
# The operator's layers, bottom to top: its sub-packages and its top-level modules alike.
OPERATOR_LAYERS: list[set[str]] = [
    {"model"},  # what a StreamReplication is: typed spec and CRD schema, names, images, status (pure)
    {"kube", "nats"},  # the Kubernetes API wrapper; the operator's NATS connections and reads
    {"checks", "build", "engine"},  # policy and Secrets; the children (pure); the engines (choice, entry, target)
    {"metrics", "settings"},
    {"reconcile"},  # the pass, applying, the engine switch, Events, the status writer, the memory
    {"handlers"},  # kopf wiring
    {"main"},  # the command
]
OPERATOR_RANK = {part: rank for rank, layer in enumerate(OPERATOR_LAYERS) for part in layer}
MAX_LINES = 600


def module_name(path: Path) -> str:
    for package, folder in PACKAGES.items():
        if path.is_relative_to(folder):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    raise AssertionError(path)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for folder in PACKAGES.values() for p in sorted(folder.rglob("*.py"))}


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `path` imports; `from pkg import name` counts as pkg.name when that is a module."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                       for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules)
    return found


def graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {name: imports_of(path, modules) - {name} for name, path in modules.items()}


def subpackage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if (parts[0] == "replicator" and len(parts) > 2) or (len(parts) == 2 and parts[1] in RANK) else None


def operator_part(module: str) -> str | None:
    """The operator's sub-package or top-level module `module` belongs to (None: the package itself)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "replication_operator" and len(parts) > 1 else None


def test_every_subpackage_has_a_layer() -> None:
    folders = {p.name for p in PACKAGES["replicator"].iterdir() if (p / "__init__.py").exists()}
    assert folders == set(RANK), "add new sub-packages to LAYERS (and to ARCHITECTURE.md)"


def test_every_operator_part_has_a_layer() -> None:
    folder = PACKAGES["replication_operator"]
    parts = {p.name for p in folder.iterdir() if (p / "__init__.py").exists()}
    parts |= {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    assert parts == set(OPERATOR_RANK), "add new operator parts to OPERATOR_LAYERS (and to ARCHITECTURE.md)"


def test_operator_imports_point_down_its_layers() -> None:
    upward = []
    for module, targets in graph().items():
        own = operator_part(module)
        if not module.startswith("replication_operator.") or own is None:
            continue
        for target in targets:
            theirs = operator_part(target)
            if not target.startswith("replication_operator.") or theirs is None or theirs == own:
                continue
            if OPERATOR_RANK[theirs] >= OPERATOR_RANK[own]:
                upward.append(f"{module} -> {target}")
    assert not upward, "operator imports against the layering:\n" + "\n".join(sorted(upward))


def test_the_operator_ships_no_test_harness() -> None:
    """Nothing under operator/ imports the test extras (the emulator lives in tests/support/)."""
    test_only = {"kmock", "jsonpatch", "pytest", "tests"}
    found = []
    for path in sorted(PACKAGES["replication_operator"].rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            found += [f"{path.relative_to(ROOT)} imports {n}" for n in names if n.split(".")[0] in test_only]
    assert not found, found


def test_imports_point_down_the_layers() -> None:
    upward = []
    for module, targets in graph().items():
        if module.startswith("replication_operator"):
            continue
        own = subpackage(module)
        for target in targets:
            if target.startswith("replication_operator"):
                upward.append(f"{module} -> {target} (the data plane never imports the operator)")
                continue
            theirs = subpackage(target)
            if own is None or theirs is None or own == theirs:
                continue
            if RANK[theirs] >= RANK[own]:
                upward.append(f"{module} -> {target}")
    assert not upward, "imports against the layering:\n" + "\n".join(sorted(upward))


def test_no_import_cycles() -> None:
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    assert not cycles, f"import cycles: {cycles}"


def test_catch_alls_say_why() -> None:
    """`except Exception` (BaseException, or a bare except) stays only at a boundary that needs it, and
    its line says why: elsewhere catch what the call raises (replicator/transport/errors.py for NATS)."""
    silent = []
    for path in sorted(p for folder in PACKAGES.values() for p in folder.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.ExceptHandler):
                continue
            caught = "bare" if node.type is None else ast.unparse(node.type)
            if caught in ("bare", "Exception", "BaseException") and "#" not in lines[node.lineno - 1]:
                silent.append(f"{rel}:{node.lineno}")
    assert not silent, "a catch-all without its reason:\n" + "\n".join(silent)


@pytest.mark.parametrize("module", sorted(all_modules()))
def test_modules_stay_small(module: str) -> None:
    lines = all_modules()[module].read_text().count("\n")
    assert lines <= MAX_LINES, f"{module} has {lines} lines: split it along its seams"
