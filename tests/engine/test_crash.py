"""Crash matrix: SIGKILL the job at every named point of the commit protocol and at random
moments, restart it each time, and require the branch's output and state to equal a
failure-free run: nothing lost, nothing duplicated."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from runners.engine import EpochRunner, read_output
from runners.engine.chunks import load_key_group
from runners.engine.crash import POINTS
from snapshots_store import Repository
from tests.engine.crash_harness import random_kills, run_job
from tests.engine.jobs import crash_job, write_epochs

pytestmark = pytest.mark.spark

EPOCHS, RECORDS = 5, 1500


def _state(repo: Repository) -> pd.DataFrame:
    manifest = repo.read_manifest(repo.resolve("main"))
    frames = [
        load_key_group(repo, chain, ("key",), use_cache=False).table.to_pandas()
        for chain in manifest.key_groups.values()
    ]
    return pd.concat(frames).sort_values("key").reset_index(drop=True)


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
    pd.testing.assert_frame_equal(_state(repo), _state(reference))
    chain = [m for _, m in repo.log("heads/main", first_parent=True)]
    assert sum(int(m.stats["records_in"]) for m in chain) == EPOCHS * RECORDS  # none lost/twice
    assert sorted(m.epoch for m in chain) == list(range(1, EPOCHS + 1))


def _sweep(
    tmp_path: Path, crash_data: str, reference: Repository, kills: list[tuple[int, float]]
) -> None:
    store = f"file://{tmp_path}/store"
    repo = Repository.open(store, "crash")
    # Every named point once, each run resuming from where the previous one was killed.
    for i, point in enumerate(POINTS):
        epoch = _head_epoch(repo) + 1 + i % 2
        run = run_job(store=store, namespace="crash", data=crash_data, crash_at=f"{point}:{epoch}")
        assert run.killed, f"{point}:{epoch} did not kill the job ({run.returncode}, {run.events})"
        assert all(e < epoch for e in run.committed) or point in ("after_cas", "mid_notify")
    for n, delay in kills:
        run_job(store=store, namespace="crash", data=crash_data, kill_after_epoch_start=(n, delay))
    final = run_job(store=store, namespace="crash", data=crash_data, parallelism=3)
    assert final.returncode == 0, final.events
    _assert_same_as_reference(repo, reference)


def test_crash_at_every_named_point_and_random_moments_then_restart_equals_failure_free_run(
    tmp_path: Path, crash_data: str, reference: Repository
) -> None:
    _sweep(tmp_path, crash_data, reference, random_kills(3, seed=1))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2, 6))
def test_crash_sweep_long(
    tmp_path: Path, crash_data: str, reference: Repository, seed: int
) -> None:
    _sweep(tmp_path, crash_data, reference, random_kills(8, seed=seed))
