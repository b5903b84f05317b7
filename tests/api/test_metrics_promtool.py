"""/metrics passes Prometheus's own lint (`promtool check metrics`, Debian's prometheus
package; CI installs it): no `quantile` label outside a summary, and no label named `job`,
which Prometheus itself sets on every scraped series."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from controlplane.autoscaler.models import AutoscaleDecision
from tests.api.conftest import Lineage
from tests.conftest import require_service

Client = Callable[[str | None], APIClient]


def test_promtool_accepts_the_metrics_page(lineage: Lineage, client_for: Client) -> None:
    promtool = shutil.which("promtool")
    require_service("promtool", promtool is not None, "apt-get install prometheus")
    assert promtool is not None
    AutoscaleDecision.objects.create(
        job=lineage.job, epoch=4, action="scale_up", outcome="recommended", mode="recommend",
        current_parallelism=2, recommended_parallelism=3, reason="test",
    )  # fmt: skip
    page = client_for("viewer").get("/metrics").content.decode()
    families = {f.name: f for f in text_string_to_metric_families(page)}
    # every family that names a job has a sample here, so the lint sees its labels
    for name in ("epochal_job_parallelism", "epochal_autoscaler_decisions"):
        assert families[name].samples, name
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=page, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0 and not checked.stdout.strip(), checked.stdout + checked.stderr
    labels = {k for f in families.values() for s in f.samples for k in s.labels}
    assert "job" not in labels and "quantile" not in labels and "job_name" in labels
