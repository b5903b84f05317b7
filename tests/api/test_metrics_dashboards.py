"""The Grafana dashboards of the Helm chart (helm/epochal/dashboards/) ask only for metrics
/metrics exports, and show every one of them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from controlplane.api.metrics import render_metrics

DASHBOARDS = Path(__file__).resolve().parents[2] / "helm" / "epochal" / "dashboards"

SCRAPE_MADE = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
"""Series Prometheus itself records for every target."""

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}
_KEYWORDS |= {"and", "or", "unless", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not its functions, labels or keywords)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        word = match.group(0)
        if text[match.end() :].lstrip().startswith("(") or word.lower() in _KEYWORDS:
            continue  # a function or an operator
        names.add(word)
    return names


def exported_names(page: str) -> dict[str, str]:
    """Every series name the page can hold -> its family (empty families included)."""
    names = {}
    for family, kind in re.findall(r"^# TYPE (\S+) (\S+)$", page, re.M):
        if kind == "counter":
            base = family.removesuffix("_total")
            names[base + "_total"] = base
        elif kind == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                names[family + suffix] = family
        else:
            names[family] = family
    return names


def test_metric_names_of_a_query() -> None:
    expr = (
        'histogram_quantile(0.9, sum by (application, le) (rate(epochal_x_bucket{a="b"}[5m])))'
        " / on (application) group_left epochal_y > 1e6 and up offset 5m"
    )
    assert metric_names(expr) == {"epochal_x_bucket", "epochal_y", "up"}


@pytest.mark.django_db
def test_dashboards_query_only_exported_metrics_and_show_them_all() -> None:
    exported = exported_names(render_metrics().decode())
    assert "epochal_rejections_total" in exported and "epochal_jobs" in exported
    used: set[str] = set()
    for path in sorted(DASHBOARDS.glob("*.json")):
        dashboard = json.loads(path.read_text())
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                names = metric_names(target["expr"])
                assert names, (path.name, target["expr"])
                unknown = names - exported.keys() - SCRAPE_MADE
                assert not unknown, f"{path.name}: {panel['title']!r} asks for {unknown}"
                used |= names
    shown = {exported[name] for name in used if name in exported}
    assert shown == set(exported.values()), set(exported.values()) - shown
