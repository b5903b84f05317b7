"""End to end: an autoscaling policy in apply mode raises a running job's parallelism when its
backlog grows, through a real Celery worker and beat (`epochal.autoscale`), a real local Spark
run and the ordinary rescale operation, which commits; no input file is lost or read twice.

The job (`slow-job`) reads one Parquet file per epoch and each split read takes
`EPOCHAL_TEST_SLOW_S` longer, so a burst of files builds a backlog the job cannot drain at p = 2.
"""

from __future__ import annotations

import pytest

from runners.engine.sources import Generator, write_parquet_file
from tests.e2e.harness import NAMESPACE, ControlPlane, wait_for
from tests.engine.jobs import DATA_ENV, SLOW_ENV

pytestmark = [pytest.mark.services, pytest.mark.spark]

RECORDS = 700  # one split per file


def test_apply_mode_scales_a_running_job_up_when_its_backlog_grows(
    control_plane: ControlPlane,
) -> None:
    from controlplane.autoscaler.models import AutoscaleDecision, AutoscalePolicy
    from controlplane.jobs.models import Job
    from controlplane.operations.models import Operation

    plane = control_plane
    data = plane.tmp / "parquet"
    data.mkdir()
    generator = Generator(keys=40, records_per_epoch=RECORDS, seed=11)
    files = 0

    def add_files(n: int) -> None:
        nonlocal files
        for _ in range(n):
            write_parquet_file(str(data), f"part-{files:05d}", generator.block(files))
            files += 1

    plane.env.update({DATA_ENV: str(data), SLOW_ENV: "1.0", "EPOCHAL_AUTOSCALE_INTERVAL_S": "1"})
    add_files(1)
    plane.manage(
        "register", NAMESPACE, "--job", "slow-job", "--job-name", "auto-main", "--parallelism", "2"
    )
    job = Job.objects.get(name="auto-main")
    AutoscalePolicy.objects.create(
        job=job,
        mode="apply",
        min_parallelism=2,
        max_parallelism=4,
        scale_up_window=2,
        metric_window=2,
        cooldown_epochs=1,
        catch_up_epochs=2,
    )
    plane.start_worker()
    out = plane.manage("start", "auto-main")
    assert "start succeeded" in out, out

    def head_epoch() -> int:
        ref = plane.repo().read_ref("heads/main")
        return 0 if ref is None else plane.repo().read_manifest(ref.target).epoch

    wait_for(lambda: head_epoch() >= 1 or None, timeout=240, what="the first epoch")
    add_files(12)  # a burst: 12 epochs of input at once, the job reads one per epoch

    rescale = wait_for(
        lambda: Operation.objects.filter(
            kind="rescale", requested_via="autoscaler", state="succeeded"
        ).first(),
        timeout=300,
        what=f"an autoscaler rescale to succeed; worker log:\n{plane.worker_log()}",
    )
    decision = AutoscaleDecision.objects.get(operation=rescale)
    assert decision.action == "scale_up" and decision.outcome == "requested"
    assert decision.mode == "apply" and decision.current_parallelism == 2
    assert 2 < decision.recommended_parallelism <= 4
    assert rescale.params["parallelism"] == decision.recommended_parallelism
    assert decision.inputs["estimates"], decision.inputs  # the per-epoch figures it used
    assert any(e.get("backlog_epochs", 0) > 0 for e in decision.inputs["estimates"])

    # the rescale commits: a later epoch runs at the new parallelism
    p = decision.recommended_parallelism
    wait_for(
        lambda: plane.head()[1].parallelism == p or None,
        timeout=240,
        what=f"an epoch at p={p}",
    )
    kinds = [(m.kind, m.parallelism) for _, m in plane.repo().log("heads/main", first_parent=True)]
    assert ("rescale", p) in kinds, kinds

    # every file is read exactly once, whatever the rescale did
    def read_per_epoch() -> list[tuple[int, int]] | None:
        epochs = [
            (m.epoch, int(m.stats["records_in"]))
            for _, m in plane.repo().log("heads/main", first_parent=True)
            if "records_in" in m.stats
        ]
        return epochs if sum(r for _, r in epochs) >= files * RECORDS else None

    epochs = wait_for(read_per_epoch, timeout=300, what=f"all {files} files read")
    assert sorted(epochs) == [(e, RECORDS) for e in range(1, files + 1)], epochs
