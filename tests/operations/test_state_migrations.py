"""migrate with mode=transform and mode=rehash, executed by the operations executor on a
lineage the engine wrote (Spark local mode); the job then continues from the migration commit
and its output equals a run that was never migrated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from controlplane.applications.models import Application, ApplicationVersion
from controlplane.jobs.models import Job
from controlplane.jobs.services import job_create
from controlplane.jobs.store import job_repository
from controlplane.operations.executor import execute
from controlplane.operations.services import operation_request
from tests.conftest import registered_store
from tests.engine.jobs import aggregate_job, reference_output, write_epochs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.spark]


@pytest.fixture
def job(tmp_path: Path) -> Job:
    app = Application.objects.create(
        name="agg", store_namespace="agg", store=registered_store(f"file://{tmp_path / 'store'}")
    )
    version = ApplicationVersion.objects.create(
        application=app,
        number=1,
        job="aggregate-job",
        config={"job_args": {"directory": str(tmp_path / "input")}},
    )
    return job_create(name="agg-main", application=app, version=version, parallelism=2)


def run_epochs(spark: Any, job: Job, directory: str, epochs: int) -> None:
    from runners.engine import EpochRunner

    runner = EpochRunner(spark, aggregate_job(directory), repo=job_repository(job), parallelism=2)
    runner.run(max_epochs=epochs)


def migrate(job: Job, **params: Any) -> Any:
    op = operation_request(
        kind="migrate", application=job.application, job=job, params=params, dispatch=False
    ).operation
    state = execute(op.pk)
    op.refresh_from_db()
    assert state == "succeeded", op.error_message
    return op


def test_transform_then_rehash_then_continue(spark: Any, job: Job, tmp_path: Path) -> None:
    directory = str(tmp_path / "input")
    write_epochs(directory, files=5, keys=300, records=2000)
    run_epochs(spark, job, directory, 2)
    repo = job_repository(job)

    transformed = migrate(job, mode="transform", function="add-note")
    commit = repo.read_manifest(transformed.result["snapshot"])
    assert commit.kind == "migration" and commit.operation_id == str(transformed.pk)
    assert commit.outputs == ()

    rehashed = migrate(job, mode="rehash", max_parallelism=64)
    commit = repo.read_manifest(rehashed.result["snapshot"])
    assert commit.kind == "migration" and commit.max_parallelism == 64
    assert repo.read_ref("heads/main").target == rehashed.result["snapshot"]

    run_epochs(spark, job, directory, 3)
    from runners.engine.output import read_output

    got = read_output(repo, "main").to_pandas()
    expected = reference_output(directory)
    cols = list(expected.columns)
    pd.testing.assert_frame_equal(
        got[cols].sort_values(["_epoch", "key"]).reset_index(drop=True),
        expected[cols].reset_index(drop=True),
        check_dtype=False,
    )
    assert repo.read_manifest(repo.read_ref("heads/main").target).max_parallelism == 64


def test_a_bad_migration_function_fails_and_leaves_the_branch(
    spark: Any, job: Job, tmp_path: Path
) -> None:
    directory = str(tmp_path / "input")
    write_epochs(directory, files=1, keys=50, records=200)
    run_epochs(spark, job, directory, 1)
    head = job_repository(job).read_ref("heads/main").target
    op = operation_request(
        kind="migrate",
        application=job.application,
        job=job,
        dispatch=False,
        params={"mode": "transform", "function": "broken-migration"},
    ).operation
    assert execute(op.pk) == "failed"
    op.refresh_from_db()
    assert op.error_code == "migration_failed" and "no_such_function" in op.error_message
    assert job_repository(job).read_ref("heads/main").target == head
