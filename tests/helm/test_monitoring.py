"""The chart's Prometheus Operator and Grafana parts: the ServiceMonitor, the PrometheusRule of
the one rules file (the docs show the same file), the dashboards' ConfigMaps; the manifests
validate (Kubernetes' schemas, the Prometheus Operator's published CRD schemas), promtool
accepts the rules and their unit tests, and every dashboard query is valid PromQL."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import require_service
from tests.helm.conftest import CHART, Helm, OperatorSchemas
from tests.helm.test_chart import by_kind, validate

PROJECT_ROOT = CHART.parents[1]
RULES = CHART / "files" / "prometheus-rules.yaml"
RULE_TESTS = Path(__file__).with_name("prometheus-rules-test.yaml")
DASHBOARDS = CHART / "dashboards"
METRICS_DOC = PROJECT_ROOT / "docs" / "metrics.md"
ALL_ON = (
    "metrics.serviceMonitor.enabled=true",
    "metrics.prometheusRule.enabled=true",
    "grafana.dashboards.enabled=true",
)
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}


def promtool() -> str:
    found = shutil.which("promtool")
    require_service("promtool", found is not None, "apt-get install prometheus")
    assert found is not None
    return found


def alerts(groups: list[dict[str, Any]]) -> list[str]:
    return [rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule]


def dashboard_queries() -> dict[str, list[str]]:
    """dashboard file name -> the PromQL of its panels' targets."""
    return {
        path.name: [
            target["expr"]
            for panel in json.loads(path.read_text())["panels"]
            for target in panel.get("targets", [])
        ]
        for path in sorted(DASHBOARDS.glob("*.json"))
    }


def test_monitoring_render_is_valid(helm: Helm, operator_schemas: OperatorSchemas) -> None:
    manifests = helm.template(*ALL_ON)
    validate([m for m in manifests if m["kind"] not in CRD_KINDS])
    crds = [m for m in manifests if m["kind"] in CRD_KINDS]
    assert sorted(m["kind"] for m in crds) == ["PrometheusRule", "ServiceMonitor"]
    assert operator_schemas.errors(crds) == []

    # the ServiceMonitor selects the web Service, by a port it has, with the token the web
    # Pods accept
    [monitor] = by_kind(manifests, "ServiceMonitor").values()
    service = by_kind(manifests, "Service")["epochal"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert selector.items() <= service["spec"]["selector"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    secret = endpoint["authorization"]["credentials"]
    assert secret == {"name": "epochal-metrics", "key": "EPOCHAL_METRICS_TOKEN"}
    token = by_kind(manifests, "Secret")["epochal-metrics"]["stringData"]
    assert len(token["EPOCHAL_METRICS_TOKEN"]) == 48
    web = by_kind(manifests, "Deployment")["epochal-web"]
    [container] = web["spec"]["template"]["spec"]["containers"]
    assert {"secretRef": {"name": "epochal-metrics"}} in container["envFrom"]
    # one target, the Service by a name DJANGO_ALLOWED_HOSTS has (a Pod address is refused)
    address = next(r for r in endpoint["relabelings"] if r.get("targetLabel") == "__address__")
    host = address["replacement"].rpartition(":")[0]
    settings = by_kind(manifests, "ConfigMap")["epochal-settings"]["data"]
    assert host in settings["DJANGO_ALLOWED_HOSTS"].split(",")

    # the PrometheusRule is the rules file
    [rule] = by_kind(manifests, "PrometheusRule").values()
    assert rule["spec"] == yaml.safe_load(RULES.read_text())

    # a dashboard ConfigMap per file, labelled for the Grafana sidecar
    dashboards = {
        name: m for name, m in by_kind(manifests, "ConfigMap").items() if "-dashboard-" in name
    }
    assert sorted(dashboards) == [
        "epochal-dashboard-control-plane",
        "epochal-dashboard-epochs-and-commits",
        "epochal-dashboard-jobs-and-lag",
        "epochal-dashboard-operations",
    ]
    for name, config_map in dashboards.items():
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        [(file, text)] = config_map["data"].items()
        assert json.loads(text) == json.loads((DASHBOARDS / file).read_text()), name

    # an existing token Secret, the dashboards elsewhere: nothing else changes
    placed = helm.template(
        *ALL_ON,
        "metrics.tokenSecret=scrape-token",
        "grafana.dashboards.namespace=monitoring",
        "grafana.dashboards.folder=Epochal",
    )
    assert "epochal-metrics" not in by_kind(placed, "Secret")
    [monitor] = by_kind(placed, "ServiceMonitor").values()
    assert monitor["spec"]["endpoints"][0]["authorization"]["credentials"]["name"] == (
        "scrape-token"
    )
    moved = [m for m in placed if m["metadata"]["name"].startswith("epochal-dashboard-")]
    assert {m["metadata"]["namespace"] for m in moved} == {"monitoring"}
    assert {m["metadata"]["annotations"]["grafana_folder"] for m in moved} == {"Epochal"}


def test_monitoring_switches_are_off_by_default_and_checked(helm: Helm) -> None:
    args = ["lint", str(CHART), "--strict", "--namespace", "epochal"]
    for value in ALL_ON:
        args += ["--set", value]
    assert "0 chart(s) failed" in helm.run(*args).stdout
    kinds = {m["kind"] for m in helm.template()}
    assert not kinds & CRD_KINDS
    refused = helm.run(
        "template", "epochal", str(CHART), "--set", "metrics.serviceMonitor.interval=soon",
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "interval" in refused.stderr


def test_the_docs_show_the_rules_file() -> None:
    """docs/metrics.md's alert rules are the chart's rules file, as it is (no copy drifts)."""
    doc = METRICS_DOC.read_text()
    section = doc[doc.index("## Alert rules") :]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block is not None
    source = "".join(
        line for line in RULES.read_text().splitlines(True) if not line.startswith("#")
    )
    assert block.group(1) == source, (
        "docs/metrics.md's alert rules differ from helm/epochal/files/prometheus-rules.yaml: "
        "copy the file (without its comment) into the docs"
    )


def test_promtool_accepts_the_rules_and_every_alert_has_a_unit_test() -> None:
    tool = promtool()
    checked = subprocess.run(
        [tool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [tool, "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    covered = {check["alertname"] for case in cases for check in case["alert_rule_test"]}
    assert covered == set(alerts(yaml.safe_load(RULES.read_text())["groups"]))
    # each alert is tested quiet and firing
    for name in covered:
        expected = [
            bool(check["exp_alerts"])
            for case in cases
            for check in case["alert_rule_test"]
            if check["alertname"] == name
        ]
        assert False in expected and True in expected, name


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    queries = dashboard_queries()
    assert sorted(queries) == [
        "control-plane.json",
        "epochs-and-commits.json",
        "jobs-and-lag.json",
        "operations.json",
    ]
    # promtool parses each query as a recording rule's expression
    rules = [
        {"record": f"dashboard:query_{i}", "expr": expr}
        for i, expr in enumerate(e for exprs in queries.values() for e in exprs)
    ]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    checked = subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_dashboards_are_grafana_dashboards_on_a_chosen_prometheus() -> None:
    uids = set()
    for path in sorted(DASHBOARDS.glob("*.json")):
        dashboard = json.loads(path.read_text())
        uids.add(dashboard["uid"])
        assert dashboard["title"].startswith("Epochal / "), path.name
        [variable] = dashboard["templating"]["list"]
        assert (variable["type"], variable["query"]) == ("datasource", "prometheus")
        panels = dashboard["panels"]
        assert len({p["id"] for p in panels}) == len(panels), path.name
        cells = set()
        for panel in panels:
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            grid = panel["gridPos"]
            area = {
                (x, y)
                for x in range(grid["x"], grid["x"] + grid["w"])
                for y in range(grid["y"], grid["y"] + grid["h"])
            }
            assert not area & cells, f"{path.name}: {panel['title']!r} overlaps another panel"
            assert grid["x"] + grid["w"] <= 24
            cells |= area
            refs = [t["refId"] for t in panel["targets"]]
            assert refs and len(set(refs)) == len(refs), panel["title"]
    assert len(uids) == len(list(DASHBOARDS.glob("*.json")))


@pytest.mark.parametrize("broken", ["sum by (state epochal_jobs", "rate(epochal_jobs)"])
def test_promtool_refuses_a_broken_query(tmp_path: Path, broken: str) -> None:
    """The check above can fail: a query promtool cannot parse or type-check is refused."""
    path = tmp_path / "broken.yaml"
    rule = {"record": "dashboard:broken", "expr": broken}
    path.write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": [rule]}]}))
    checked = subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode != 0
