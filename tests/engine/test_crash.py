"""Crash matrix: SIGKILL the job at every named point of the commit protocol, at random
moments inside an epoch (proved: the epoch had started and did not commit) and one of its Python
workers mid-epoch; restart it each time, finally at another parallelism with epochs left to
process, and require the branch's output and state to equal a failure-free run: nothing lost,
nothing duplicated."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from runners.engine import EpochRunner, read_output
from runners.engine.crash import POINTS
from snapshots_store import Repository
from tests.engine.crash_harness import branch_state, head_epoch, random_kills, run_job
from tests.engine.jobs import crash_job, write_epochs

pytestmark = pytest.mark.spark

EPOCHS, RECORDS = 9, 1500
SPLITS_PER_EPOCH = 3  # 1500 records in splits of 700 rows
SLOW_S = 0.3  # extra seconds per split read in the runs killed at random moments
FINAL_EPOCHS = 2  # epochs left for the restart at parallelism 3 after every kill


def _frame(repo: Repository) -> pd.DataFrame:
    return read_output(repo, "main").to_pandas()


@pytest.fixture(scope="module")
def crash_data(tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = tmp_path_factory.mktemp("crash") / "in"
    write_epochs(str(directory), files=EPOCHS, keys=300, records=RECORDS, seed=11)
    return str(directory)


@pytest.fixture(scope="module")
def reference(spark: Any, crash_data: str, tmp_path_factory: pytest.TempPathFactory) -> Repository:
    root = tmp_path_factory.mktemp("reference")
    repo = Repository.open(f"file://{root}/store", "crash")
    os.environ["EPOCHAL_TEST_DATA"] = crash_data
    EpochRunner(spark, crash_job(), repo=repo, parallelism=2).run()
    return repo


def _head_epoch(repo: Repository) -> int:
    head = repo.read_ref("heads/main")
    return 0 if head is None else repo.read_manifest(head.target).epoch


def _assert_same_as_reference(repo: Repository, reference: Repository) -> None:
    assert _head_epoch(repo) == EPOCHS
    pd.testing.assert_frame_equal(_frame(repo), _frame(reference))
    pd.testing.assert_frame_equal(branch_state(repo), branch_state(reference))
    chain = [m for _, m in repo.log("heads/main", first_parent=True)]
    assert sum(int(m.stats["records_in"]) for m in chain) == EPOCHS * RECORDS  # none lost/twice
    assert sorted(m.epoch for m in chain) == list(range(1, EPOCHS + 1))


def _random_kill(
    store: str, crash_data: str, n: int, fraction: float, *, worker: bool = False
) -> int:
    """SIGKILL the job (or one of its Python workers) `fraction` of the way through the reads
    of its n-th epoch; assert the kill landed inside that epoch and return the epoch."""
    base = head_epoch(store, "crash")
    n = n if base + n <= EPOCHS - FINAL_EPOCHS else 1
    assert base + n <= EPOCHS - FINAL_EPOCHS, f"no epoch left to interrupt (head {base})"
    delay = fraction * SPLITS_PER_EPOCH * SLOW_S  # every scan task reads every split
    if worker:
        run = run_job(
            store=store, namespace="crash", data=crash_data, slow_s=SLOW_S,
            kill_worker_after_epoch_start=(n, delay),
        )  # fmt: skip
        assert run.worker_killed, f"no Python worker to kill in epoch {base + n}: {run.events}"
        # the task whose worker died fails the Spark job: the driver gives up on the epoch
        assert not run.killed and run.returncode != 0, (run.returncode, run.events)
        assert run.head_epoch == base + n - 1, "an epoch whose worker was killed committed"
        return base + n
    run = run_job(
        store=store, namespace="crash", data=crash_data, slow_s=SLOW_S,
        kill_after_epoch_start=(n, delay),
    )  # fmt: skip
    assert run.killed, f"the kill after {delay:.2f} s missed the job: {run.events}"
    assert run.interrupted_epoch == base + n, (
        f"the kill {delay:.2f} s after the start of epoch {base + n} landed outside it "
        f"(head before {run.base_epoch}, after {run.head_epoch}, events {run.events})"
    )
    return base + n


def _sweep(
    tmp_path: Path, crash_data: str, reference: Repository, kills: list[tuple[int, float]]
) -> list[int]:
    """Named points, then `kills` random kills and one Python-worker kill, each inside an epoch,
    then a restart at parallelism 3 that processes the epochs left. Returns the epochs the
    random and worker kills interrupted."""
    store = f"file://{tmp_path}/store"
    repo = Repository.open(store, "crash")
    # Every named point once, each run resuming from where the previous one was killed.
    for i, point in enumerate(POINTS):
        epoch = _head_epoch(repo) + 1 + i % 2
        run = run_job(store=store, namespace="crash", data=crash_data, crash_at=f"{point}:{epoch}")
        assert run.killed, f"{point}:{epoch} did not kill the job ({run.returncode}, {run.events})"
        assert all(e < epoch for e in run.committed) or point in ("after_cas", "mid_notify")
    interrupted = [_random_kill(store, crash_data, n, fraction) for n, fraction in kills]
    interrupted.append(_random_kill(store, crash_data, 1, 0.4, worker=True))
    left = EPOCHS - _head_epoch(repo)
    assert left >= FINAL_EPOCHS
    final = run_job(store=store, namespace="crash", data=crash_data, parallelism=3)
    assert final.returncode == 0, final.events
    assert len(final.committed) == left  # the restart at a new parallelism did real epochs
    parallelism = [e["parallelism"] for e in final.events if e.get("event") == "committed"]
    assert parallelism == [3] * left
    _assert_same_as_reference(repo, reference)
    return interrupted


def test_crash_at_every_named_point_and_random_moments_then_restart_equals_failure_free_run(
    tmp_path: Path, crash_data: str, reference: Repository
) -> None:
    interrupted = _sweep(tmp_path, crash_data, reference, random_kills(3, seed=1))
    # named points: 6 kills inside the commit protocol; random + worker kills: all mid-epoch
    print(f"crash sweep: {len(POINTS)} named-point kills, {len(interrupted)} mid-epoch kills")


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2, 6))
def test_crash_sweep_long(
    tmp_path: Path, crash_data: str, reference: Repository, seed: int
) -> None:
    _sweep(tmp_path, crash_data, reference, random_kills(8, seed=seed))
