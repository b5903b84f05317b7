"""A Celery worker SIGKILLed in each phase of rescale, rollback and fork: the operation
converges to a terminal state on the next worker, exactly one job instance runs afterwards,
and no process of an earlier run is left behind.

The kill comes from the executor's fault injection (`EPOCHAL_OPERATION_CRASH_AT`), right
after a phase acted but before its success was recorded — the retry must redo the phase
without doing its work twice."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runners.local import group_members
from tests.e2e.harness import ControlPlane, wait_for

pytestmark = [pytest.mark.services, pytest.mark.spark]

PHASES = {
    "rescale": ["stop", "rescale_commit", "write_control", "relaunch", "await_running"],
    "rollback": [
        "check_source",
        "verify_target",
        "stop",
        "tag_abandoned",
        "move_head",
        "restart",
        "await_running",
    ],
    "fork": ["create_version", "create_branch", "create_job", "start", "await_running"],
}


def alive_runs(plane: ControlPlane) -> dict[str, list[int]]:
    """run id -> live processes of its group, for every run directory of the test."""
    alive = {}
    for pid_file in (plane.tmp / "var" / "runs").glob("*/pid"):
        pid = json.loads(pid_file.read_text())["pid"]
        members = group_members(pid)
        if members:
            alive[pid_file.parent.name] = members
    return alive


def check_one_instance(plane: ControlPlane, job: str, where: str) -> None:
    from controlplane.jobs.models import Run

    live = list(Run.objects.filter(job__name=job, phase__in=["pending", "running"]))
    assert len(live) == 1, f"{where}: {len(live)} live runs of {job}"
    running = alive_runs(plane)
    mine = {r.run_id for r in Run.objects.filter(job__name=job)}
    assert set(running) & mine == {live[0].run_id}, f"{where}: processes {running}"


def crash_and_recover(plane: ControlPlane, kind: str, phase: str, *args: str) -> Any:
    from controlplane.operations.models import Operation

    worker = plane.start_worker(crash_at=f"{kind}:{phase}")
    out = plane.manage(kind if kind != "migrate" else "migrate_job", *args, "--no-wait")
    op_id = out.split()[2]
    wait_for(lambda: worker.poll() is not None, timeout=180, what=f"the worker to die in {phase}")
    plane.kill_worker(worker)  # its embedded beat too
    op = Operation.objects.get(pk=op_id)
    assert op.state == "running" and op.current_phase == phase, (op.state, op.current_phase)
    healthy = plane.start_worker()
    op = wait_for(
        lambda: Operation.objects.filter(
            pk=op_id, state__in=["succeeded", "failed", "cancelled"]
        ).first(),
        timeout=240,
        what=f"{kind} killed in {phase} to end\n{plane.worker_log()}",
    )
    assert op.state == "succeeded", f"{kind}/{phase}: {op.state} {op.error_message}"
    assert op.attempts >= 2
    plane.stop_workers()
    del healthy
    return op


@pytest.fixture
def running_job(control_plane: ControlPlane) -> ControlPlane:
    plane = control_plane
    plane.add_input(files=3)
    plane.register()
    plane.start_worker()
    plane.manage("start", "clicks-main")
    plane.wait_caught_up()
    plane.stop_workers()
    return plane


@pytest.mark.slow  # the rollback's crash in each phase runs in CI; these two with -m slow
def test_rescale_survives_a_worker_killed_in_each_phase(running_job: ControlPlane) -> None:
    plane = running_job
    p = 2
    for phase in PHASES["rescale"]:
        p = 1 if p == 2 else 2
        op = crash_and_recover(
            plane, "rescale", phase, "clicks-main", "-p", str(p), "--mode", "restart"
        )
        _, head = plane.head()
        assert head.kind == "rescale" and head.parallelism == p and head.operation_id == str(op.pk)
        check_one_instance(plane, "clicks-main", f"rescale/{phase}")


def test_rollback_survives_a_worker_killed_in_each_phase(running_job: ControlPlane) -> None:
    plane = running_job
    for phase in PHASES["rollback"]:
        before = plane.wait_caught_up()  # the replay after the previous rollback is done
        target = plane.repo().resolve(f"{before}~1")
        op = crash_and_recover(plane, "rollback", phase, "clicks-main", "--to", target)
        commit = plane.repo().read_manifest(op.result["snapshot"])
        assert commit.kind == "rollback" and commit.parents == (target,)
        assert plane.repo().read_ref(f"tags/{op.result['abandoned_tag']}").target == before
        # exactly one rollback commit per operation, whatever the number of attempts
        moves = [e for e in plane.repo().reflog("heads/main") if e.operation_id == str(op.pk)]
        assert [m.new for m in moves] == [op.result["snapshot"]]
        check_one_instance(plane, "clicks-main", f"rollback/{phase}")


@pytest.mark.slow  # the rollback's crash in each phase runs in CI; these two with -m slow
def test_fork_survives_a_worker_killed_in_each_phase(running_job: ControlPlane) -> None:
    from controlplane.applications.models import ApplicationVersion
    from controlplane.jobs.models import Job

    plane = running_job
    source, _ = plane.head()
    for phase in PHASES["fork"]:
        branch = f"fork-{phase.replace('_', '-')}"
        op = crash_and_recover(
            plane,
            "fork",
            phase,
            "--job",
            "clicks-main",
            "--snapshot",
            source,
            "--branch",
            branch,
            "--new-job",  # as an admin: a new version, so create_version runs too
            "clickstream",
            "--code-version",
            f"crash-{phase}",
            "--start",
        )
        _, head = plane.head(branch)
        assert head.kind == "fork" and head.parents == (source,)
        # one version per fork, however often its phases ran
        forks_so_far = PHASES["fork"].index(phase) + 1
        assert ApplicationVersion.objects.filter(source_snapshot_id=source).count() == forks_so_far
        assert Job.objects.filter(branch=branch).count() == 1
        check_one_instance(plane, op.result["job"], f"fork/{phase}")
        plane.start_worker()
        plane.manage("stop", op.result["job"])
        plane.stop_workers()
    check_one_instance(plane, "clicks-main", "after the forks")
