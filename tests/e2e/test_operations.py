"""End to end: start → epochs → live rescale 2→3 → restart rescale 3→1 → savepoint → rollback →
fork → migrate to a second store → stop, through the `epochal` command, a real Celery worker on
Redis, PostgreSQL and real Spark jobs. After every step the job's output equals a failure-free run's
over the same input, the lineage index shows the operation's commits with their provenance, and
`GET /metrics` answers after every operation kind."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import NAMESPACE, ControlPlane, output_rows, wait_for
from tests.scrape import scrape_metrics

pytestmark = [pytest.mark.services, pytest.mark.spark]


def reference_output(spark: Any, input_dir: Path, tmp: Path) -> list[tuple[Any, ...]]:
    """A failure-free run of the same job over the same input, in this process."""
    from runners.engine import EpochRunner
    from runners.engine.output import read_output
    from runners.jobs import clickstream
    from snapshots_store import Repository

    repo = Repository.open(f"file://{tmp / 'reference-store'}", NAMESPACE)
    runner = EpochRunner(spark, clickstream.job(str(input_dir)), repo=repo, parallelism=2)
    runner.run()
    return output_rows(read_output(repo, "main"))


def branch_output(plane: ControlPlane, branch: str, store_url: str | None = None) -> list[Any]:
    from runners.engine.output import read_output

    return output_rows(read_output(plane.repo(store_url), branch))


def indexed(operation_id: str) -> list[Any]:
    from controlplane.lineage.models import Snapshot

    return list(Snapshot.objects.filter(operation_id=operation_id))


def last_operation(kind: str) -> Any:
    from controlplane.operations.models import Operation

    return Operation.objects.filter(kind=kind).order_by("-created_at").first()


def live_runs(job: str) -> list[Any]:
    from controlplane.jobs.models import Run

    return list(Run.objects.filter(job__name=job, phase__in=["pending", "running"]))


def test_operations_end_to_end(control_plane: ControlPlane, spark: Any, tmp_path: Path) -> None:
    plane = control_plane
    plane.add_input(files=3)
    plane.register()
    plane.start_worker()

    # start → epochs commit
    out = plane.epochal("start", "clicks-main", "--reason", "first start")
    assert "start succeeded" in out, out
    plane.wait_caught_up()
    assert branch_output(plane, "main") == reference_output(spark, plane.input_dir, tmp_path / "r1")
    _, head = plane.head()
    assert head.kind == "epoch" and head.parallelism == 2
    scrape_metrics("start")

    # live rescale 2 → 3: effective at the next epoch, committed as kind "rescale"
    plane.epochal("rescale", "clicks-main", "-p", "3", "--mode", "live", "--no-wait")
    live = last_operation("rescale")
    plane.add_input(files=5)
    sid = plane.wait_caught_up()
    out = plane.epochal("operation", str(live.pk), "--wait")
    assert "rescale succeeded" in out, out
    snapshots = wait_for(lambda: indexed(str(live.pk)), timeout=60, what="live rescale indexed")
    assert any(s.kind == "rescale" and s.parallelism == 3 for s in snapshots)
    assert plane.head()[1].parallelism == 3
    scrape_metrics("rescale")
    assert branch_output(plane, "main") == reference_output(spark, plane.input_dir, tmp_path / "r2")

    # restart rescale 3 → 1: a metadata-only rescale commit, a new run at parallelism 1
    out = plane.epochal("rescale", "clicks-main", "-p", "1", "--mode", "restart")
    assert "rescale succeeded" in out, out
    restart = last_operation("rescale")
    # progress moves with the worker's steps: each phase reported, in order, as it ends
    names = [p["name"] for p in restart.phases]
    ended = re.findall(r"^  step (\d+)/\d+  (\w+) +succeeded", out, re.MULTILINE)
    assert [(int(k), name) for k, name in ended] == list(enumerate(names, start=1)), out
    [commit] = indexed(str(restart.pk))
    assert commit.kind == "rescale" and commit.parallelism == 1
    assert commit.provenance["from_parallelism"] == "3"
    assert len(live_runs("clicks-main")) == 1 and live_runs("clicks-main")[0].parallelism == 1
    scrape_metrics("rescale")  # the restart rescale's commit has no epoch timing
    plane.add_input(files=6)
    plane.wait_caught_up()
    assert branch_output(plane, "main") == reference_output(spark, plane.input_dir, tmp_path / "r3")

    # savepoint: a tag at the head
    out = plane.epochal("savepoint", "clicks-main", "--name", "before-rollback")
    assert "savepoint succeeded" in out, out
    assert plane.repo().read_ref("tags/before-rollback").target == plane.head()[0]
    scrape_metrics("savepoint")

    # rollback to an earlier snapshot: abandoned head tagged, replay gives the same output
    target = sid  # the head after the live rescale
    abandoned, _ = plane.head()
    out = plane.epochal("rollback", "clicks-main", "--to", target[:16], "--reason", "bad deploy")
    assert "rollback succeeded" in out, out
    rollback = last_operation("rollback")
    [commit] = indexed(str(rollback.pk))
    assert commit.kind == "rollback"
    assert commit.provenance["abandoned_head"] == abandoned
    assert commit.provenance["rolled_back_to"] == target
    assert plane.repo().read_ref(f"tags/{rollback.result['abandoned_tag']}").target == abandoned
    plane.wait_caught_up()
    assert branch_output(plane, "main") == reference_output(spark, plane.input_dir, tmp_path / "r4")
    scrape_metrics("rollback")

    # fork a new version from a snapshot and run it
    out = plane.epochal(
        "fork",
        "--job",
        "clicks-main",
        "--snapshot",
        target[:16],
        "--branch",
        "experiment",
        "--code-version",
        "2",
        "--start",
        "--reason",
        "try v2",
    )
    assert "fork succeeded" in out, out
    fork = last_operation("fork")
    [commit] = indexed(str(fork.pk))
    assert commit.kind == "fork" and commit.branch == "experiment"
    assert commit.provenance["source_snapshot"] == target
    assert commit.provenance["reason"] == "try v2"
    from controlplane.applications.models import ApplicationVersion

    version = ApplicationVersion.objects.get(jobs__name=fork.result["job"])
    assert version.source_snapshot_id == target and version.code_version == "2"
    plane.wait_caught_up("experiment")
    assert branch_output(plane, "experiment") == branch_output(plane, "main")
    scrape_metrics("fork")

    # migrate to a second store: the other job must stop first (the whole lineage moves)
    second = f"file://{tmp_path / 'second-store'}"
    out = plane.epochal("register-store", "second", second)
    assert "registered store second" in out, out
    out = plane.epochal("migrate", "clicks-main", "--store", "second", check=False)
    assert "still run on the current store" in out, out
    plane.manage("stop", fork.result["job"])
    out = plane.epochal("migrate", "clicks-main", "--store", "second")
    assert "migrate succeeded" in out, out
    plane.add_input(files=7)
    plane.wait_caught_up(store_url=second)
    expected = reference_output(spark, plane.input_dir, tmp_path / "r5")
    assert branch_output(plane, "main", second) == expected
    # the first store is untouched: its head is where the migration found it
    assert plane.head(store_url=plane.store_url)[0] != plane.head(store_url=second)[0]
    from controlplane.lineage.models import Snapshot

    wait_for(
        lambda: Snapshot.objects.filter(snapshot_id=plane.head(store_url=second)[0]).exists(),
        timeout=60,
        what="the index to follow the second store",
    )
    assert len(live_runs("clicks-main")) == 1
    scrape_metrics("migrate")
    plane.manage("stop", "clicks-main")
    assert live_runs("clicks-main") == []
    scrape_metrics("stop")
