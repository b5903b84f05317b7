"""A real Prometheus (Debian's `prometheus` package; CI installs it) scrapes a live control
plane's /metrics with the metrics token, evaluates the rules the chart ships
(helm/epochal/files/prometheus-rules.yaml) and fires the lag alert for a job behind its input:
the alert names the job (`job_name`, not the scrape job Prometheus calls `job`) and says by
how much."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests
import yaml

from controlplane.lineage.services import reindex_application
from tests.api.conftest import Lineage
from tests.conftest import require_service
from tests.security.servers import free_port

RULES = Path(__file__).resolve().parents[2] / "helm" / "epochal" / "files" / "prometheus-rules.yaml"
TOKEN = "prometheus-scrape-token"
LAG_ALERT = "EpochalJobFallingBehind"


def shipped_rules(*, for_: dict[str, str]) -> dict[str, Any]:
    """The shipped rules, with the `for` of the alerts named in `for_` shortened (a test
    cannot wait 10 minutes); expressions, labels and annotations as shipped."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") in for_:
                rule["for"] = for_[rule["alert"]]
    return rules


@contextmanager
def prometheus(config: dict[str, Any], rules: dict[str, Any], home: Path) -> Iterator[str]:
    binary = shutil.which("prometheus")
    require_service("prometheus", binary is not None, "apt-get install prometheus")
    assert binary is not None
    (home / "rules.yaml").write_text(yaml.safe_dump(rules))
    (home / "prometheus.yaml").write_text(yaml.safe_dump({**config, "rule_files": ["rules.yaml"]}))
    port = free_port()
    with (home / "prometheus.log").open("w") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={home / 'prometheus.yaml'}",
                f"--storage.tsdb.path={home / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            cwd=home,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while not _ready(url):
                assert process.poll() is None, (home / "prometheus.log").read_text()
                assert time.monotonic() < deadline, (home / "prometheus.log").read_text()
                time.sleep(0.2)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _ready(url: str) -> bool:
    try:
        return requests.get(f"{url}/-/ready", timeout=2).status_code == 200
    except requests.ConnectionError:
        return False


def falls_behind(lineage: Lineage, backlog: int) -> None:
    """The job commits epoch 5 on main; its source reports `backlog` epochs waiting."""
    repo, head = lineage.repo, lineage.main[-1]
    base = repo.read_manifest(head)
    manifest = dataclasses.replace(
        base,
        epoch=5,
        parents=(head,),
        kind="epoch",
        stats={"records_in": 150, "process_s": 0.2, "backlog_epochs": backlog},
    )
    repo.commit(manifest, "main", expected_head=head, reason="epoch 5")
    reindex_application(application=lineage.application, repo=repo)


def wait_for_alert(url: str, name: str, timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    seen: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        answer = requests.get(f"{url}/api/v1/alerts", timeout=5).json()
        seen = answer["data"]["alerts"]
        for alert in seen:
            if alert["labels"]["alertname"] == name and alert["state"] == "firing":
                return dict(alert)
        time.sleep(0.5)
    targets = requests.get(f"{url}/api/v1/targets", timeout=5).json()
    raise AssertionError(f"{name} did not fire in {timeout_s} s: alerts {seen}, targets {targets}")


def test_prometheus_fires_the_lag_alert_naming_the_job(
    live_server: Any, transactional_db: None, lineage: Lineage, settings: Any, tmp_path: Path
) -> None:
    settings.EPOCHAL_METRICS_TOKEN = TOKEN
    falls_behind(lineage, backlog=7)
    target = live_server.url.removeprefix("http://")
    config = {
        "global": {"scrape_interval": "500ms", "evaluation_interval": "500ms"},
        "scrape_configs": [
            {
                "job_name": "epochal",
                "authorization": {"type": "Bearer", "credentials": TOKEN},
                "static_configs": [{"targets": [target]}],
            }
        ],
    }
    rules = shipped_rules(for_={LAG_ALERT: "1s"})
    with prometheus(config, rules, tmp_path) as url:
        alert = wait_for_alert(url, LAG_ALERT)
        series = requests.get(
            f"{url}/api/v1/query", params={"query": "epochal_job_lag_epochs"}, timeout=5
        ).json()["data"]["result"]
        health = requests.get(f"{url}/api/v1/targets", timeout=5).json()["data"]

    assert alert["labels"] == {
        "alertname": LAG_ALERT,
        "job_name": "clicks-main",  # the Epochal job
        "application": "clicks",
        "job": "epochal",  # Prometheus's scrape job: no `exported_job` anywhere
        "instance": target,
        "severity": "warning",
    }
    assert alert["annotations"] == {
        "summary": "clicks-main is 7 epochs behind its input",
        "description": "Input waits faster than the job reads it. Rescale it (or set an "
        "autoscaling policy: docs/autoscaling.md).",
    }
    assert [(s["metric"]["job_name"], s["value"][1]) for s in series] == [("clicks-main", "7")]
    [scraped] = health["activeTargets"]
    assert scraped["health"] == "up" and scraped["lastError"] == ""
