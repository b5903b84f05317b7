"""Hot-swap at epoch S (docs/webs.md): every epoch's results reach the output from
exactly one job — the old one up to S, the new one after — also when either job crashes
between the two steps of the swap commit (in-process restarts, and SIGKILL of the job
process at the engine's crash points)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from runners.engine import EpochRunner
from runners.engine.hotswap import (
    SwapError,
    SwapSide,
    acknowledged,
    check_swappable,
    send_phase,
    swap_output,
    swapped,
)
from runners.engine.state_ops import new_branch_commit
from snapshots_store import Repository
from tests.conftest import SUBPROCESS_PYTHONPATH
from tests.engine.jobs import DATA_ENV, aggregate_job, reference_output

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[2]
S = 4


def _setup(spark: Any, tmp_path: Path, epochs_dir: str) -> tuple[Repository, SwapSide, SwapSide]:
    url = f"file://{tmp_path}/store"
    repo = Repository.open(url, "app")
    EpochRunner(spark, aggregate_job(epochs_dir), repo=repo, parallelism=2).run(max_epochs=2)
    new_branch_commit(
        repo, "main", "v2", kind="fork", operation_id="op-fork",
        provenance={"reason": "new version"}, code_version="2",
    )  # fmt: skip
    old, new = SwapSide(url, "app", "main"), SwapSide(url, "app", "v2")
    check_swappable(old, new)
    return repo, old, new


def _runner(spark: Any, repo: Repository, branch: str, epochs_dir: str) -> EpochRunner:
    job = aggregate_job(epochs_dir, code_version="2" if branch == "v2" else "1")
    return EpochRunner(spark, job, repo=repo, branch=branch, parallelism=2)


def _check(old: SwapSide, new: SwapSide, epochs_dir: str) -> None:
    out = swap_output(old, new).to_pandas()
    jobs = out.groupby("_epoch")["_job"].unique()
    assert {int(e): list(j) for e, j in jobs.items()} == {
        e: ["old" if e <= S else "new"] for e in range(1, 7)
    }
    got = out.drop(columns=["_job"]).sort_values(["_epoch", "key"]).reset_index(drop=True)
    expected = reference_output(epochs_dir)
    pd.testing.assert_frame_equal(got[expected.columns], expected, check_dtype=False)


@pytest.mark.parametrize("crash", ["old", "new"])
def test_swap_at_s_delivers_each_epoch_from_exactly_one_job(
    spark: Any, tmp_path: Path, epochs_dir: str, crash: str
) -> None:
    repo, old, new = _setup(spark, tmp_path, epochs_dir)
    o, n = _runner(spark, repo, "main", epochs_dir), _runner(spark, repo, "v2", epochs_dir)
    send_phase("swap-1", old, new, S, "prepared")  # step 1
    assert o.run_epoch() is not None and n.run_epoch() is not None  # epoch 3, acknowledged
    assert o.run_epoch() is not None  # epoch 4 = S
    assert o.run_epoch() is None and o.stopped_reason.startswith("swap:")  # holds before S+1
    assert o.should_wait(follow=False)
    assert acknowledged(old, "swap-1", "prepared") and acknowledged(new, "swap-1", "prepared")
    # the job named by `crash` dies between the two steps and restarts from its head
    if crash == "old":
        o = _runner(spark, repo, "main", epochs_dir)
    else:
        n = _runner(spark, repo, "v2", epochs_dir)
    send_phase("swap-1", old, new, S, "committed")  # step 2
    send_phase("swap-1", old, new, S, "prepared")  # a retried step 1 never moves it back
    assert n.run_epoch() is not None  # epoch 4: still voided
    assert not swapped(old, new, "swap-1", S)
    assert n.run_epoch() is not None  # epoch 5: emits (the old job has committed S)
    for runner in (o, n):
        while runner.run_epoch() is not None:
            pass
    assert swapped(old, new, "swap-1", S)
    _check(old, new, epochs_dir)


def test_the_new_job_waits_for_the_old_job_to_complete_s(
    spark: Any, tmp_path: Path, epochs_dir: str
) -> None:
    repo, old, new = _setup(spark, tmp_path, epochs_dir)
    o, n = _runner(spark, repo, "main", epochs_dir), _runner(spark, repo, "v2", epochs_dir)
    send_phase("swap-2", old, new, S, "prepared")
    assert n.run_epoch() is not None and o.run_epoch() is not None  # both at epoch 3
    send_phase("swap-2", old, new, S, "committed")
    assert n.run_epoch() is not None  # 4, voided
    assert n.run_epoch() is None and "old job to commit epoch 4" in (n.stopped_reason or "")
    for runner in (o, n):
        while runner.run_epoch() is not None:
            pass
    _check(old, new, epochs_dir)


def test_a_new_job_that_emitted_after_the_fork_is_refused(
    spark: Any, tmp_path: Path, epochs_dir: str
) -> None:
    repo, old, new = _setup(spark, tmp_path, epochs_dir)
    assert _runner(spark, repo, "v2", epochs_dir).run_epoch() is not None  # emits epoch 3
    with pytest.raises(SwapError, match="emitted output in its epoch 3"):
        check_swappable(old, new)


def _job_process(
    store: str, branch: str, data: str, *, max_epochs: int, crash_at: str | None = None
) -> int:
    env = {
        **os.environ,
        DATA_ENV: data,
        "PYTHONPATH": SUBPROCESS_PYTHONPATH,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    env.pop("EPOCHAL_CRASH_AT", None)
    if crash_at:
        env["EPOCHAL_CRASH_AT"] = crash_at
    cmd = [
        sys.executable, "-m", "runners.engine.main", "--job", "crash-job",
        "--store", store, "--namespace", "app", "--branch", branch, "--parallelism", "2",
        "--master", "local[2]", "--max-epochs", str(max_epochs),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=300)
    return done.returncode


def test_swap_survives_a_sigkill_of_either_job_between_the_steps(
    spark: Any, tmp_path: Path, epochs_dir: str
) -> None:
    repo, old, new = _setup(spark, tmp_path, epochs_dir)
    store = old.store
    send_phase("swap-3", old, new, S, "prepared")
    # the old job process acknowledges the prepare in epoch 3 and is SIGKILLed right after its
    # commit; the new job process is SIGKILLed after writing epoch 3's manifest (before its CAS)
    assert _job_process(store, "main", epochs_dir, max_epochs=2, crash_at="after_cas:3") != 0
    assert _job_process(store, "v2", epochs_dir, max_epochs=2, crash_at="after_manifest:3") != 0
    assert acknowledged(old, "swap-3", "prepared") == 3
    assert acknowledged(new, "swap-3", "prepared") is None  # its epoch 3 never committed
    # both restart (new processes) and acknowledge; the old one stops at S
    assert _job_process(store, "main", epochs_dir, max_epochs=1) == 0  # epoch 4 = S
    assert _job_process(store, "v2", epochs_dir, max_epochs=1) == 0  # epoch 3, voided
    assert acknowledged(new, "swap-3", "prepared") == 3
    send_phase("swap-3", old, new, S, "committed")
    o, n = _runner(spark, repo, "main", epochs_dir), _runner(spark, repo, "v2", epochs_dir)
    for runner in (n, o, n):
        while runner.run_epoch() is not None:
            pass
    assert swapped(old, new, "swap-3", S)
    _check(old, new, epochs_dir)
