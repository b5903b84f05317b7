"""The arrows between our packages point one way: web -> controlplane -> runners -> snapshots_store.

The import graph is built from the source with `ast` — module-level and function-level imports
alike, since a deferred import is still a dependency — and must have no cycle between our modules
and no arrow pointing up the layers (docs/architecture.md).
"""

from __future__ import annotations

import ast
import functools
import re
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


@functools.cache
def _tree(path: Path) -> ast.Module:
    """`path` parsed once per test session (every rule here walks the same modules)."""
    return ast.parse(path.read_text(), str(path))


def _imported_names(module: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    is_package = path.name == "__init__.py"
    for node in ast.walk(_tree(path)):
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


# -- sizes, configuration, grammars -----------------------------------------------------------

MAX_FUNCTION_LINES = 80
LONG_DECLARATIONS: dict[str, str] = {}
"""``module:function`` -> why it may be longer: declarative code only (a chart's or a page
layout's table of fields). Nothing in controlplane/operations needs it today."""


def long_functions(tree: ast.AST, module: str) -> list[str]:
    """``module:function (N lines)`` for every function (methods and nested ones too) of
    `tree` longer than `MAX_FUNCTION_LINES`, decorators not counted."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                found.append(f"{module}:{node.name} ({lines} lines)")
    return found


def test_no_function_over_80_lines_in_controlplane_operations() -> None:
    modules = {
        name: path
        for name, path in _our_modules().items()
        if name.startswith("controlplane.operations")
    }
    found = [
        entry
        for name, path in modules.items()
        for entry in long_functions(_tree(path), name)
        if entry.split(" (")[0] not in LONG_DECLARATIONS
    ]
    assert not found, "functions over 80 lines (split them into named steps):\n" + "\n".join(found)
    body = "\n".join(f"    x{n} = {n}" for n in range(MAX_FUNCTION_LINES))
    long = ast.parse(f"def f():\n{body}\n")
    assert long_functions(long, "m") == ["m:f (81 lines)"]  # the rule can fail


CONFIGURATION_MODULES = {"controlplane.config"}
"""The one place of the control plane that reads the environment (`controlplane.settings`
asks it, once, at start-up; everything else reads `django.conf.settings`)."""


def environment_reads(tree: ast.AST) -> list[int]:
    """Lines of `tree` that read the process environment: ``os.environ`` (any use but
    ``os.environ.setdefault("DJANGO_SETTINGS_MODULE", …)``, the bootstrap of a Django
    process), ``os.getenv``, ``from os import environ / getenv``."""
    allowed: set[int] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "setdefault"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == "DJANGO_SETTINGS_MODULE"
        ):
            allowed.add(id(node.func.value))
    lines = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ("environ", "getenv", "environb")
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
            and id(node) not in allowed
        ) or (
            isinstance(node, ast.ImportFrom)
            and node.module == "os"
            and any(alias.name in ("environ", "getenv", "environb") for alias in node.names)
        ):
            lines.append(node.lineno)
    return sorted(lines)


def test_only_the_configuration_module_reads_the_environment_in_the_control_plane() -> None:
    found = [
        f"{name}:{line}"
        for name, path in _our_modules().items()
        if name.startswith("controlplane.") and name not in CONFIGURATION_MODULES
        for line in environment_reads(_tree(path))
    ]
    assert not found, (
        "environment read outside controlplane/config.py (add a setting to "
        "controlplane/settings.py and read django.conf.settings):\n" + "\n".join(found)
    )
    read = "import os\nx = os.environ.get('EPOCHAL_X', '1')\n"
    bootstrap = "import os\nos.environ.setdefault('DJANGO_SETTINGS_MODULE', 'x')\n"
    assert environment_reads(ast.parse(read)) == [2]  # the rule can fail
    assert environment_reads(ast.parse("from os import getenv\n")) == [1]
    assert environment_reads(ast.parse(bootstrap)) == []


REVISION_GRAMMAR = "snapshots_store.revisions"
_GRAMMAR_PATTERN = re.compile(r"\[\\?\^?[^\]]*~|~\(|~\[0-9|~\\d|\\\^\(|\\\^\[0-9|\\\^\\d")
_STEP_SPLITTERS = {"find", "rfind", "index", "rindex", "split", "rsplit", "partition", "rpartition"}


def revision_grammars(tree: ast.AST) -> list[int]:
    """Lines of `tree` that define revision syntax of their own: a regular expression over
    ``~n`` / ``^n`` steps, or a string searched or split at ``~`` or ``^``."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _GRAMMAR_PATTERN.search(node.value):
                lines.append(node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _STEP_SPLITTERS
            and any(isinstance(a, ast.Constant) and a.value in ("~", "^") for a in node.args)
        ):
            lines.append(node.lineno)
    return sorted(set(lines))


def test_one_revision_grammar() -> None:
    """Revisions are parsed by `snapshots_store.revisions` alone (the store resolves with it,
    the lineage index compiles it to SQL, the API validates with it)."""
    found = [
        f"{name}:{line}"
        for name, path in _our_modules().items()
        if name != REVISION_GRAMMAR
        for line in revision_grammars(_tree(path))
    ]
    assert not found, (
        "a second revision grammar (parse with snapshots_store.revisions.parse_revision):\n"
        + "\n".join(found)
    )
    assert revision_grammars(_tree(ROOT / "snapshots_store" / "revisions.py"))
    # What the three grammars before looked like is caught:
    assert revision_grammars(ast.parse('_SUFFIX = r"(?:~(\\d*)|\\^(\\d*))\\Z"\n')) == [1]
    assert revision_grammars(ast.parse('P = r"[a-z]+([~^][0-9]{0,9})*$"\n')) == [1]
    assert revision_grammars(ast.parse('base, _, n = rev.rpartition("~")\n')) == [1]


# -- the engine's rooms: short functions; the runners' configuration read in one place ----------

#: declarative code of runners/engine/ that may be longer (a table or a layout, not logic)
ENGINE_LONG_FUNCTIONS: dict[str, str] = {}


def test_no_engine_function_runs_over_80_lines() -> None:
    too_long = [
        entry
        for name, path in _our_modules().items()
        if name.startswith("runners.engine")
        for entry in long_functions(_tree(path), name)
        if entry.split(" (")[0] not in ENGINE_LONG_FUNCTIONS
    ]
    assert not too_long, (
        f"functions over {MAX_FUNCTION_LINES} lines in runners/engine/ (cut them into named "
        "steps, as run_epoch's stages are; docs/engine.md):\n" + "\n".join(too_long)
    )
    method = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    nested = ast.parse(f"def short():\n    pass\n\n\nclass C:\n    def long(self):\n{method}\n")
    assert long_functions(nested, "m") == ["m:long (81 lines)"]  # the rule can fail


#: the one module of runners/ that reads the process environment (docs/architecture.md)
RUNNERS_CONFIGURATION = "runners.config"


def test_runners_read_the_environment_only_in_their_configuration() -> None:
    reads = [
        f"{name}:{line}"
        for name, path in _our_modules().items()
        if name.startswith("runners.") and name != RUNNERS_CONFIGURATION
        for line in environment_reads(_tree(path))
    ]
    assert not reads, (
        "os.environ read in runners/ outside runners/config.py (add a field to "
        "runners.config.RunnersConfig and take the object):\n" + "\n".join(reads)
    )
    sneaky = "import os\nfrom os import getenv\n\nA = os.environ.get('X')\n"
    assert environment_reads(ast.parse(sneaky)) == [2, 4]  # the rule can fail
