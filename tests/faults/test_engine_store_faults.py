"""A job committing epochs to an S3 store behind the fault proxy: random 500s, SlowDowns, resets
and held answers are retried away; an outage past the retry budget stops the job with a reason
naming the store (exit status 4, no traceback) and no commit reported that is not on the store;
restarted, the job finishes with output and state identical to a fault-free run."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from runners.engine import read_output
from snapshots_store import Repository, check_repository
from tests.engine.crash_harness import branch_state, run_job
from tests.faults.conftest import EPOCHS, FAST_RETRY_ENV, RECORDS
from tests.faults.report import record
from tests.faults.s3_proxy import FaultyS3Proxy

pytestmark = [pytest.mark.spark, pytest.mark.faults]

OUTAGE_BUDGET_S = "2"
OUTAGE_LIMIT_S = 120.0


def _running(marker: str) -> bool:
    """Whether a process whose command line contains `marker` is alive."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    return True
            except OSError:
                continue
    return False


def _resume_after_exit(proxy: FaultyS3Proxy, marker: str) -> None:
    deadline = time.monotonic() + OUTAGE_LIMIT_S
    time.sleep(0.5)
    while _running(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    proxy.resume()


def _direct(store: str, proxy: FaultyS3Proxy) -> Repository:
    upstream = f"http://{proxy.upstream.hostname}:{proxy.upstream.port}"
    return Repository.open(store.split("?")[0] + f"?endpoint_url={upstream}", "crash")


def test_job_survives_store_faults_and_an_outage_past_its_budget(
    proxied_store: str, s3_proxy: FaultyS3Proxy, fault_data: str, reference: Repository
) -> None:
    s3_proxy.rate = 0.05
    env = {**FAST_RETRY_ENV, "EPOCHAL_STORE_RETRY_BUDGET_S": OUTAGE_BUDGET_S}
    bucket = proxied_store.split("/")[2]

    def outage() -> None:  # until the job gave up and exited (this process's retries wait)
        s3_proxy.pause()
        threading.Thread(target=_resume_after_exit, args=(s3_proxy, bucket), daemon=True).start()

    first = run_job(store=proxied_store, namespace="crash", data=fault_data, slow_s=0.2,
                    extra_env=env, after_epoch_start=(2, 0.1, outage))  # fmt: skip
    stopped = [e for e in first.events if e.get("event") == "stopped"]
    assert first.returncode == 4, (first.returncode, first.events)
    reason = str(stopped[-1]["reason"])
    assert reason.startswith("store s3://") and "unavailable" in reason, reason
    assert "Traceback" not in reason
    # no commit reported that is not on the store: the head is the last one announced
    assert first.committed == list(range(1, first.head_epoch + 1)), first.events
    assert first.head_epoch < EPOCHS
    direct = _direct(proxied_store, s3_proxy)
    assert check_repository(direct).ok

    resumed_at = time.monotonic()
    second = run_job(store=proxied_store, namespace="crash", data=fault_data, extra_env=env)
    assert second.returncode == 0, second.events
    recovered_s = time.monotonic() - resumed_at
    s3_proxy.rate = 0.0
    assert second.head_epoch == EPOCHS
    pd.testing.assert_frame_equal(
        read_output(direct, "main").to_pandas(), read_output(reference, "main").to_pandas()
    )
    pd.testing.assert_frame_equal(branch_state(direct), branch_state(reference))
    chain = [m for _, m in direct.log("heads/main", first_parent=True)]
    assert sum(int(m.stats["records_in"]) for m in chain) == EPOCHS * RECORDS
    assert sorted(m.epoch for m in chain) == list(range(1, EPOCHS + 1))
    assert check_repository(direct).ok
    injected = sum(s3_proxy.injected.values())
    assert injected >= 2, s3_proxy.injected
    record("object_store_job", injected=injected, survived=injected, lost=0, duplicated=0,
           recover_s=[recovered_s])  # fmt: skip
