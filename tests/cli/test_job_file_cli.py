"""`epochal export`, `diff -f` and `apply -f` as a user runs them (a subprocess against the
test's database): an edit of the parallelism becomes a rescale operation requested once; the
drift of an old file shows in its diff; `jobs show` says where the Spark UI is. The same on a
running Spark job, through a Celery worker: tests/e2e/test_spark_ui_and_job_files.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from controlplane.jobs.models import Job
from controlplane.operations.models import Operation
from tests.cli.test_epochal import env as env  # the fixture
from tests.cli.test_epochal import epochal
from tests.operations.test_requests import job as job  # the fixture

pytestmark = pytest.mark.django_db(transaction=True)


def test_export_edit_diff_apply(env: dict[str, str], tmp_path: Path, job: Job) -> None:
    exported = epochal(env, tmp_path, "export").stdout
    (tmp_path / "old.yaml").write_text(exported)
    document = yaml.safe_load(exported)
    [entry] = document["jobs"]
    assert (entry["name"], entry["parallelism"], entry["state"]) == ("clicks-main", 2, "stopped")

    entry["parallelism"] = 3
    (tmp_path / "jobs.yaml").write_text(yaml.safe_dump(document))
    diff = epochal(env, tmp_path, "diff", "-f", "jobs.yaml").stdout
    assert "clicks-main: parallelism 2 -> 3: rescale operation {'parallelism': 3}" in diff
    assert not Operation.objects.exists()  # a diff requests nothing
    [outcome] = json.loads(epochal(env, tmp_path, "apply", "-f", "jobs.yaml", "--json").stdout)
    assert (outcome["request"], outcome["outcome"]) == ("rescale", "requested"), outcome
    operation = Operation.objects.get(pk=outcome["operation"])
    assert (operation.kind, operation.params["parallelism"]) == ("rescale", 3)
    assert (operation.requested_via, operation.reason) == ("cli", "job file")
    again = epochal(env, tmp_path, "apply", "-f", "jobs.yaml").stdout
    assert "already requested" in again and Operation.objects.count() == 1

    Job.objects.filter(pk=job.pk).update(parallelism=3)  # as the rescale leaves it
    Operation.objects.filter(pk=operation.pk).update(state="succeeded")
    drift = epochal(env, tmp_path, "diff", "-f", "old.yaml").stdout
    assert "clicks-main: parallelism 3 -> 2: rescale operation" in drift

    shown = epochal(env, tmp_path, "jobs", "show", "clicks-main").stdout
    assert "spark ui:    none (no running run)" in shown, shown
