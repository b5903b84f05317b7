"""The arrows between our packages point one way: web -> controlplane -> runners -> snapshots_store.

The import graph is built from the source with `ast` — module-level and function-level imports
alike, since a deferred import is still a dependency — and must have no cycle between our modules
and no arrow pointing up the layers (docs/architecture.md).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("snapshots_store", "runners", "controlplane", "web")
LAYER = {name: rank for rank, name in enumerate(PACKAGES)}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _our_modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            modules[_module_name(path)] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module of ours that `name` (a module or a name inside one) refers to."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _imported_names(module: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                drop = node.level - 1 if is_package else node.level
                anchor = anchor[: len(anchor) - drop]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            for alias in node.names:
                # `from package import module` imports the module, else a name of `base`.
                candidate = f"{base}.{alias.name}"
                yield candidate if candidate in modules else base


def import_graph() -> dict[str, set[str]]:
    """Our module -> the modules of ours it imports (anywhere in its body)."""
    modules = _our_modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for imported in _imported_names(name, path, modules):
            target = _resolve(imported, modules)
            if target is not None and target != name:
                graph[name].add(target)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def _layer(module: str) -> int:
    return LAYER[module.split(".")[0]]


def test_no_import_cycle_between_our_modules() -> None:
    cycles = import_cycles(import_graph())
    assert not cycles, "import cycles (break them; docs/architecture.md):\n" + "\n".join(
        " <-> ".join(cycle) for cycle in cycles
    )


def test_no_arrow_points_up_the_layers() -> None:
    upward = sorted(
        f"{source} -> {target}"
        for source, targets in import_graph().items()
        for target in targets
        if _layer(target) > _layer(source)
    )
    assert not upward, "imports against web -> controlplane -> runners -> snapshots_store:\n" + (
        "\n".join(upward)
    )


def test_the_checker_sees_function_level_imports_and_cycles() -> None:
    """The rule itself can fail: a deferred import closing a loop is reported as a cycle."""
    graph = import_graph()
    # `replicate` is imported inside a phase function of the migrate operation.
    assert "snapshots_store.replicate" in graph["controlplane.operations.kinds.migrate"]
    assert "snapshots_store.errors" in graph["snapshots_store.repository"]
    looped = {**graph, "snapshots_store.errors": {*graph["snapshots_store.errors"]}}
    looped["snapshots_store.errors"].add("snapshots_store.repository")
    [cycle] = import_cycles(looped)
    assert {"snapshots_store.errors", "snapshots_store.repository"} <= set(cycle)


# -- the engine's rooms: short functions; the runners' configuration read in one place ----------

#: the longest function runners/engine/ may hold: a stage of the epoch, not the whole epoch
ENGINE_FUNCTION_LINES = 80
#: declarative code that may be longer (a table or a layout, not logic): module:function -> why
ENGINE_LONG_FUNCTIONS: dict[str, str] = {}


def _where(path: Path) -> str:
    """Our module's dotted name, or the file's stem for a file outside the repository."""
    return _module_name(path) if path.is_relative_to(ROOT) else path.stem


def long_functions(paths: list[Path], limit: int) -> list[str]:
    """``module:function (n lines)`` for each function (methods and nested functions too) in
    `paths` whose body runs over `limit` lines (from ``def`` to its last line)."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{_where(path)}:{node.name} ({lines} lines)")
    return found


def test_no_engine_function_runs_over_80_lines() -> None:
    paths = sorted((ROOT / "runners" / "engine").rglob("*.py"))
    too_long = [
        f
        for f in long_functions(paths, ENGINE_FUNCTION_LINES)
        if f.partition(" ")[0] not in ENGINE_LONG_FUNCTIONS
    ]
    assert not too_long, (
        f"functions over {ENGINE_FUNCTION_LINES} lines in runners/engine/ (cut them into named "
        "steps, as run_epoch's stages are; docs/engine.md):\n" + "\n".join(too_long)
    )


def test_the_length_rule_can_fail(tmp_path: Path) -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(80))
    source = tmp_path / "long.py"
    source.write_text(f"def short():\n    pass\n\n\nclass C:\n    def long(self):\n{body}\n")
    assert long_functions([source], ENGINE_FUNCTION_LINES) == ["long:long (81 lines)"]
    assert not long_functions([source], 81)


#: the one module of runners/ that reads the process environment (docs/architecture.md)
RUNNERS_CONFIG = ROOT / "runners" / "config.py"


def environ_reads(path: Path) -> list[str]:
    """``module:line`` of each use of the process environment in `path` (reading it, or
    changing it for what reads it later): ``os.environ``, ``os.getenv``, and
    ``environ``/``getenv`` imported from os."""
    found: list[int] = []
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        hit = (
            isinstance(node, ast.Attribute)
            and node.attr in ("environ", "getenv", "environb", "getenvb")
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ) or (
            isinstance(node, ast.ImportFrom)
            and node.module == "os"
            and any(a.name in ("environ", "getenv", "environb", "getenvb") for a in node.names)
        )
        if hit:
            found.append(node.lineno)
    return [f"{_where(path)}:{line}" for line in sorted(found)]


def test_runners_read_the_environment_only_in_their_configuration() -> None:
    reads = [
        read
        for path in sorted((ROOT / "runners").rglob("*.py"))
        if path != RUNNERS_CONFIG
        for read in environ_reads(path)
    ]
    assert not reads, (
        "os.environ read in runners/ outside runners/config.py (add a field to "
        "runners.config.RunnersConfig and take the object):\n" + "\n".join(reads)
    )


def test_the_environment_rule_can_fail(tmp_path: Path) -> None:
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text("import os\nfrom os import getenv\n\nA = os.environ.get('X')\n")
    assert environ_reads(sneaky) == ["sneaky:2", "sneaky:4"]
    (tmp_path / "clean.py").write_text("import os\n\nA = os.path.join('a', 'b')\n")
    assert not environ_reads(tmp_path / "clean.py")
