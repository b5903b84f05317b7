"""The control plane drives jobs on Kubernetes with nothing changed but the job's runner:
start → the reconciler follows the driver Pod (OOMKilled surfaces as the job's reason) →
stop at the deadline deletes the Pod. The Kubernetes API is a double over real HTTP, reached
through the official client configured by a kubeconfig file (KUBECONFIG), as on a laptop."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml
from kubernetes import client

from controlplane.applications.models import Application, ApplicationVersion
from controlplane.jobs import services as job_services
from controlplane.jobs.models import Job, Run
from controlplane.jobs.services import job_create
from controlplane.operations.executor import execute
from controlplane.operations.models import Operation
from controlplane.operations.reconciler import reconcile_jobs
from controlplane.operations.services import operation_request
from tests.conftest import registered_store
from tests.e2e.harness import wait_for
from tests.runners.kube_double import RunningDouble, api_server_double

pytestmark = pytest.mark.django_db(transaction=True)
NS = "streaming"


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningDouble]:
    with api_server_double() as double:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "double",
                    "clusters": [{"name": "double", "cluster": {"server": double.url}}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "double", "context": {"cluster": "double", "user": "u"}}],
                }
            )
        )
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        monkeypatch.setenv("EPOCHAL_K8S_NAMESPACE", NS)
        monkeypatch.setenv("EPOCHAL_IMAGE", "registry.example.com/epochal:1")
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        job_services._LAUNCHERS.clear()  # a launcher per process, configured from the env
        yield double
        job_services._LAUNCHERS.clear()


@pytest.fixture
def job(tmp_path: Path) -> Job:
    app = Application.objects.create(
        name="clicks",
        store_namespace="clicks",
        store=registered_store(f"file://{tmp_path / 'store'}"),
    )
    version = ApplicationVersion.objects.create(
        application=app,
        number=1,
        job="clickstream",
        config={
            "job_args": {"directory": "/data/clicks"},
            "resources": {"executor_cores": 2, "executor_memory_mb": 4096},
        },
    )
    return job_create(
        name="clicks-main", application=app, version=version, parallelism=4, runner="kubernetes"
    )


def pod_status(api: RunningDouble, name: str, status: dict[str, Any]) -> None:
    core = client.CoreV1Api(api.api_client())
    core.patch_namespaced_pod_status(name, NS, {"status": status}, _preload_content=False)


def in_thread(operation_id: Any) -> threading.Thread:
    def run() -> None:
        from django.db import connection

        try:
            execute(operation_id)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_start_follow_and_stop_a_job_on_kubernetes(api: RunningDouble, job: Job) -> None:
    op = operation_request(kind="start", application=job.application, job=job, dispatch=False)
    worker = in_thread(op.operation.pk)
    run = wait_for(
        lambda: Run.objects.filter(job=job).exclude(handle=None).first(),
        timeout=30,
        what="the run to be launched",
    )
    pod = f"clicks-{run.run_id}-driver"
    created = wait_for(lambda: api.object("pods", NS, pod), timeout=10, what="the driver pod")
    env = {e["name"]: e.get("value") for e in created["spec"]["containers"][0]["env"]}
    assert env["EPOCHAL_RUN_ID"] == run.run_id
    args = created["spec"]["containers"][0]["args"]
    assert "--job-args" in args and '{"directory": "/data/clicks"}' in args
    assert "--follow" in args and args[args.index("--parallelism") + 1] == "4"

    # the driver comes up and prints its first event: the start operation succeeds
    pod_status(
        api,
        pod,
        {
            "phase": "Running",
            "containerStatuses": [{"name": "spark-driver", "state": {"running": {}}}],
        },
    )
    api.k["get", kmock.path(f"/api/v1/namespaces/{NS}/pods/{pod}/log")] << (
        b'{"event": "started", "branch": "main"}\n'
    )
    worker.join(timeout=60)
    op.operation.refresh_from_db()
    assert op.operation.state == "succeeded", op.operation.error_message
    job.refresh_from_db()
    assert job.state == "running" and job.effective_runner == "kubernetes"

    # the reconciler follows the Pod: an OOMKilled driver is the run's and the job's reason
    pod_status(
        api,
        pod,
        {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "spark-driver",
                    "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
                }
            ],
        },
    )
    assert reconcile_jobs() == (1, 1)  # the first restart is requested in the same tick
    reconcile_jobs()  # its start operation is active: nothing more to do
    run.refresh_from_db()
    job.refresh_from_db()
    assert run.phase == "failed" and run.reason == "OOMKilled (exit code 137)"
    assert job.state == "failed" and "OOMKilled" in job.status_reason
    assert job.restarts == 1 and job.next_restart_at is None
    [restart] = Operation.objects.filter(job=job, kind="start", requested_via="reconciler")
    assert run.run_id in restart.reason and "OOMKilled" in restart.reason


def test_stop_deletes_the_driver_at_the_deadline(api: RunningDouble, job: Job) -> None:
    from controlplane.jobs.services import run_launch

    run = run_launch(job, run_id="abcdef012345")
    pod = "clicks-abcdef012345-driver"
    pod_status(api, pod, {"phase": "Running"})
    op = operation_request(
        kind="stop",
        application=job.application,
        job=job,
        params={"stop_deadline_s": 1},
        dispatch=False,
    )
    assert execute(op.operation.pk) == "succeeded"
    run.refresh_from_db()
    assert run.phase == "stopped" and "deleted at the 1 s stop deadline" in run.reason
    assert api.object("pods", NS, pod) is None
    from controlplane.jobs.store import job_repository

    control, _ = job_repository(job).read_control("main")
    assert control["stop"]["run_id"] == run.run_id  # asked to stop at an epoch boundary first
