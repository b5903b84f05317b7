"""The control plane with RUNNER=standalone: a job runs on the cluster, its driver is killed
inside an epoch, and the reconciler restarts the run on the cluster from the branch head."""

from __future__ import annotations

import pytest

from runners.local_cluster import LocalCluster
from tests.conftest import SUBPROCESS_PYTHONPATH
from tests.e2e.conftest import control_plane  # noqa: F401 - the fixture
from tests.e2e.harness import ControlPlane, wait_for
from tests.store.conftest import S3_ENV

pytestmark = [pytest.mark.services, pytest.mark.spark]


def test_a_driver_killed_inside_an_epoch_is_restarted_on_the_cluster_from_the_head(
    control_plane: ControlPlane,  # noqa: F811
    spark_cluster: LocalCluster,
    s3_store_endpoint: str,
) -> None:
    from controlplane.jobs.models import Job, Run

    plane = control_plane
    plane.store_url = f"s3://cluster/control-plane?endpoint_url={s3_store_endpoint}"
    plane.env.update(
        {
            **S3_ENV,
            "STORE_URL": plane.store_url,
            "RUNNER": "standalone",
            "SPARK_STANDALONE_MASTER": spark_cluster.master_url,
            "SPARK_STANDALONE_EXECUTOR_PYTHONPATH": SUBPROCESS_PYTHONPATH,
        }
    )
    crashed = plane.tmp / "crashed"
    # the driver SIGKILLs itself in epoch 2 once its manifest is written and before the
    # compare-and-swap that commits it: provably inside the epoch (crash.py); once only
    plane.env["EPOCHAL_CRASH_AT"] = "after_manifest:2"
    plane.env["EPOCHAL_CRASH_ONCE_FILE"] = str(crashed)
    plane.add_input(files=1)
    plane.register()
    Job.objects.filter(name="clicks-main").update(restart_backoff_s=1)
    plane.start_worker()
    plane.manage("start", "clicks-main")
    head = plane.wait_caught_up()
    assert plane.head()[1].epoch == 1
    [first] = Run.objects.filter(job__name="clicks-main")
    assert first.runner == "standalone"
    assert {e.worker for e in spark_cluster.executors()}, "the run has no executor on the cluster"

    plane.add_input(files=2)  # epoch 2 starts, and its driver dies inside it
    wait_for(lambda: crashed.exists() or None, timeout=120, what="the driver to die in epoch 2")
    log = (plane.tmp / "var" / "runs" / first.run_id / "output.log").read_text()
    assert '"event": "epoch_start", "n": 2' in log
    wait_for(
        lambda: (
            Run.objects.filter(job__name="clicks-main", phase="running")
            .exclude(run_id=first.run_id)
            .first()
        ),
        timeout=180,
        what="the reconciler to restart the job",
    )
    first.refresh_from_db()
    assert first.phase == "failed", first.reason
    assert Job.objects.get(name="clicks-main").restarts == 1
    new_head = plane.wait_caught_up(timeout=300)
    epoch2 = plane.head()[1]
    assert new_head != head and epoch2.parents == (head,) and epoch2.epoch == 2
