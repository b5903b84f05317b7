"""A pattern that validates input matches the whole string (`snapshots_store.patterns`).

With Python's `re.match`/`re.search`, ``$`` also matches before a trailing newline:
``"1g\\n"`` passed as a Spark memory, ``"main~1\\n"`` as a rollback target, ``"main\\n"`` as a
job name. Through the deployed server every such value is now a 400 naming its field; and a
scan of the code finds no ``$``-anchored pattern used with `match`/`search`, no Django or DRF
regex validator but the whole-string one, and no JSON-schema validator but the one whose
`pattern` is whole-string.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.security.deployed import APPLICATION, JOB, Deployment, api

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("snapshots_store", "runners", "controlplane", "web", "bench")
HELPERS = {"snapshots_store/patterns.py", "controlplane/patterns.py"}


# -- the scan ---------------------------------------------------------------------------------


def _modules() -> dict[str, tuple[Path, ast.Module]]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            found[name] = (path, ast.parse(path.read_text(), str(path)))
    return found


def _string_constants(tree: ast.Module) -> dict[str, str]:
    constants = {}
    for node in tree.body:
        target = value = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if (
            isinstance(target, ast.Name)
            and isinstance(value, ast.Constant)
            and isinstance(value.value, str)
        ):
            constants[target.id] = value.value
    return constants


def _anchored(pattern: str) -> bool:
    """Ends in an unescaped ``$``: with match/search it also matches before a newline."""
    return pattern.endswith("$") and not pattern.endswith("\\$")


def _violations() -> Iterator[str]:
    modules = _modules()
    constants = {name: _string_constants(tree) for name, (_, tree) in modules.items()}
    for name, (path, tree) in modules.items():
        where = str(path.relative_to(ROOT))
        known = dict(constants[name])
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in constants:
                for alias in node.names:
                    if alias.name in constants[node.module]:
                        known[alias.asname or alias.name] = constants[node.module][alias.name]

        def text(expr: ast.expr, known: dict[str, str] = known) -> str | None:
            if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
                return expr.value
            if isinstance(expr, ast.Name):
                return known.get(expr.id)
            return None

        compiled: set[str] = set()  # names bound to re.compile(<anchored>)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Assign | ast.AnnAssign)
                and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute)
                and node.value.func.attr == "compile"
                and node.value.args
            ):
                pattern = text(node.value.args[0])
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if pattern is not None and _anchored(pattern):
                    compiled |= {t.id for t in targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            line = f"{where}:{node.lineno}"
            if isinstance(func, ast.Attribute) and called in ("match", "search"):
                owner = func.value
                if isinstance(owner, ast.Name) and owner.id in compiled:
                    yield f"{line}: {owner.id}.{called}() of a $-anchored pattern"
                if isinstance(owner, ast.Name) and owner.id == "re" and node.args:
                    pattern = text(node.args[0])
                    if pattern is not None and _anchored(pattern):
                        yield f"{line}: re.{called}() with the $-anchored {pattern!r}"
            if where in HELPERS:
                continue
            if called in ("RegexValidator", "RegexField"):
                yield f"{line}: {called} (search: use controlplane.patterns' whole-string one)"
            if called.startswith("Draft") and called.endswith("Validator"):
                yield f"{line}: {called} (use controlplane.patterns.SchemaValidator)"


def test_no_anchored_pattern_is_used_with_match_or_search() -> None:
    assert sorted(_violations()) == []


def test_the_scan_finds_what_it_looks_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan is not vacuous: today's kind of code is found."""
    bad = ROOT / "web" / "_scan_probe.py"
    bad.write_text(
        "import re\nfrom django.core.validators import RegexValidator\n"
        "P = r'^[a-z]+$'\n_X = re.compile(P)\n"
        "def f(v):\n    RegexValidator(P)\n    return _X.match(v) or re.search(P, v)\n"
    )
    try:
        found = [v for v in _violations() if "_scan_probe" in v]
    finally:
        bad.unlink()
    assert len(found) == 3, found


# -- through the deployed server --------------------------------------------------------------


@pytest.fixture(scope="module")
def base(deployment: Deployment) -> Iterator[str]:
    with deployment.serve() as url:
        yield url


def refused(response: requests.Response, field: str) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert field in error["fields"], error
    return error


def test_a_trailing_newline_is_a_400_naming_the_field(deployment: Deployment, base: str) -> None:
    operator, admin = deployment.tokens["operator"], deployment.tokens["admin"]
    job = {"name": "nl-job", "application": APPLICATION}
    refused(api(base, operator, "POST", "/api/jobs/", json={**job, "name": "main\n"}), "name")
    refused(api(base, operator, "POST", "/api/jobs/", json={**job, "branch": "exp\n"}), "branch")
    memory = api(
        base,
        operator,
        "POST",
        "/api/jobs/",
        json={**job, "spark_conf": {"spark.driver.memory": "1g\n"}},
    )
    refused(memory, "spark_conf.spark.driver.memory")
    refused(api(base, admin, "POST", "/api/applications/", json={"name": "main\n"}), "name")
    namespace = {"name": "nl-app", "store_namespace": "main\n"}
    refused(api(base, admin, "POST", "/api/applications/", json=namespace), "store_namespace")
    operations = f"/api/jobs/{JOB}/operations/"
    rollback = {"kind": "rollback", "params": {"to": "main~1\n"}}
    refused(api(base, operator, "POST", operations, json=rollback), "to")
    savepoint = {"kind": "savepoint", "params": {"name": "before\n"}}
    refused(api(base, operator, "POST", operations, json=savepoint), "name")
    fork = {"kind": "fork", "params": {"snapshot": deployment.main[-1], "branch": "nl\n"}}
    refused(
        api(base, operator, "POST", f"/api/applications/{APPLICATION}/operations/", json=fork),
        "branch",
    )
    viewer = deployment.tokens["viewer"]
    log = f"/api/applications/{APPLICATION}/snapshots/"
    refused(api(base, viewer, "GET", log, params={"rev": "main\n"}), "rev")
    diff = f"{log}{deployment.main[-1]}/diff/"
    refused(api(base, viewer, "GET", diff, params={"against": "main\n"}), "against")
    # nothing was created
    jobs = api(base, viewer, "GET", "/api/jobs/").json()["results"]
    assert [j["name"] for j in jobs] == [JOB]
    apps = api(base, viewer, "GET", "/api/applications/").json()["results"]
    assert [a["name"] for a in apps] == [APPLICATION]
    ops = api(base, viewer, "GET", "/api/operations/").json()["results"]
    assert ops == [], json.dumps(ops)[:500]
