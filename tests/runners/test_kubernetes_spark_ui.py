"""A Kubernetes run's Spark UI: the driver's `started` event, read through the API server
double (its Pod's log), names the driver Service's UI port, and only that address is usable;
the Service exposes the port (tests/runners/test_kubernetes.py checks the whole manifests)."""

from __future__ import annotations

import json

import kmock

from controlplane.jobs.models import Run, RunPhase
from controlplane.jobs.spark_ui import address_problem, reported_address
from runners.job_spec import JobSpec
from runners.kubernetes import KubernetesLauncher
from tests.runners.kube_double import RunningDouble
from tests.runners.test_kubernetes import NS, api, launcher, spec  # noqa: F401  (fixtures)


def test_the_driver_reports_the_service_ui_port_and_only_it_is_used(
    api: RunningDouble,  # noqa: F811
    launcher: KubernetesLauncher,  # noqa: F811
    spec: JobSpec,  # noqa: F811
) -> None:
    handle = launcher.start(spec)
    address = f"http://orders-app-{spec.run_id}-driver-svc.{NS}.svc:4040"
    started = {"event": "started", "branch": "main", "spark_ui": address}
    log = f"{json.dumps(started)}\n" + '{"event": "epoch_start", "n": 1}\n'
    pod = f"orders-app-{spec.run_id}-driver"
    api.k["get", kmock.path(f"/api/v1/namespaces/{NS}/pods/{pod}/log")] << log.encode()

    assert reported_address(launcher.logs(handle, tail_lines=2000)) == address
    run = Run(
        run_id=spec.run_id,
        runner="kubernetes",
        parallelism=spec.parallelism,
        spec=spec.to_dict(),
        handle=handle.to_dict(),
        phase=RunPhase.RUNNING,
    )
    assert address_problem(run, address) == ""
    assert address_problem(run, address.replace(":4040", ":7078")) != ""  # the RPC port
    assert address_problem(run, address.replace(f".{NS}.", ".kube-system.")) != ""
