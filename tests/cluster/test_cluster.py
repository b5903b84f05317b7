"""The engine on a real Spark standalone cluster: executors in their own JVMs on two workers that
share no disk, state on an object store. Exactly-once output must equal a `local[2]` run of the
same input when executors and whole workers are killed inside an epoch, when a live rescale
adds and removes executors, and when a restart finds no state cached anywhere."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from runners.engine import EpochRunner, read_output
from runners.engine.state.codec import encode_table
from runners.local_cluster import LocalCluster
from snapshots_store import Repository
from tests.cluster.conftest import CLUSTER_SUBMIT_ARGS
from tests.engine.crash_harness import Run, branch_state, head_epoch, run_job
from tests.engine.jobs import crash_job, write_epochs

pytestmark = pytest.mark.spark

EPOCHS, RECORDS, KEYS = 6, 1500, 300
SPLITS_PER_EPOCH = 3  # 1500 records in splits of 700 rows
SLOW_S = 1.0  # extra seconds per split read: an epoch lasts long enough to kill inside it


@pytest.fixture(scope="module")
def cluster_data(tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = tmp_path_factory.mktemp("cluster-in") / "in"
    write_epochs(str(directory), files=EPOCHS, keys=KEYS, records=RECORDS, seed=17)
    return str(directory)


@pytest.fixture(scope="module")
def reference(spark: Any, cluster_data: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The same job on `local[2]` in this process, on a filesystem store."""
    root = tmp_path_factory.mktemp("cluster-reference")
    repo = Repository.open(f"file://{root}/store", "crash")
    os.environ["EPOCHAL_TEST_DATA"] = cluster_data
    EpochRunner(spark, crash_job(), repo=repo, parallelism=2).run()
    return repo


def assert_same_as_reference(store: str, reference: Repository) -> list[Any]:
    """Output (byte for byte) and state equal the reference; every epoch once. Returns the
    branch's first-parent manifests, oldest first."""
    repo = Repository.open(store, "crash")
    assert head_epoch(store, "crash") == EPOCHS
    ours, theirs = read_output(repo, "main"), read_output(reference, "main")
    assert encode_table(ours) == encode_table(theirs)
    pd.testing.assert_frame_equal(branch_state(repo), branch_state(reference))
    chain = [m for _, m in repo.log("heads/main", first_parent=True)][::-1]
    assert [m.epoch for m in chain] == list(range(1, EPOCHS + 1))
    assert sum(int(m.stats["records_in"]) for m in chain) == EPOCHS * RECORDS
    return chain


def _run(store: str, data: str, cluster: LocalCluster, env: dict[str, str], **kw: Any) -> Run:
    return run_job(
        store=store,
        namespace="crash",
        data=data,
        master=cluster.master_url,
        submit_args=CLUSTER_SUBMIT_ARGS,
        extra_env=env,
        **kw,
    )


def _committed_after(store: str, epoch: int, moment: float) -> bool:
    """Whether epoch `epoch` of the branch was committed after `moment` (a time.time())."""
    repo = Repository.open(store, "crash")
    for _, manifest in repo.log("heads/main", first_parent=True):
        if manifest.epoch == epoch:
            created = dt.datetime.fromisoformat(manifest.created_at).timestamp()
            return created > moment
    return False


def test_engine_on_the_cluster_equals_local_and_keeps_state_per_executor(
    spark_cluster: LocalCluster,
    s3_store: str,
    cluster_data: str,
    reference: Repository,
    driver_cache: dict[str, str],
) -> None:
    spark_cluster.wipe_state_caches()
    seen: set[int] = set()

    def note_executors() -> None:
        seen.update(e.worker for e in spark_cluster.executors())

    note = (2, 0.5, note_executors)
    run = _run(s3_store, cluster_data, spark_cluster, driver_cache, after_epoch_start=note)
    assert run.returncode == 0, run.events
    chain = assert_same_as_reference(s3_store, reference)
    assert seen == {0, 1}, "the epoch did not run on both workers"
    # each worker's executor cached the key groups it owned, in its own directory only
    cached = [
        sum(1 for f in spark_cluster.state_cache(i).rglob("*") if f.is_file()) for i in (0, 1)
    ]
    assert all(cached), f"a worker's state cache stayed empty: {cached}"
    assert all(m.extra["executors"]["requested"] == 2 for m in chain)


def test_executor_killed_inside_an_epoch_is_retried_elsewhere_and_commits_once(
    spark_cluster: LocalCluster,
    s3_store: str,
    cluster_data: str,
    reference: Repository,
    driver_cache: dict[str, str],
) -> None:
    killed: list[tuple[float, int]] = []

    def kill_an_executor() -> None:
        executors = spark_cluster.executors()
        assert executors, "no executor to kill"
        victim = executors[-1]
        os.kill(victim.pid, signal.SIGKILL)
        killed.append((time.time(), victim.pid))

    delay = 0.5 * SPLITS_PER_EPOCH * SLOW_S / 2
    run = _run(
        s3_store,
        cluster_data,
        spark_cluster,
        driver_cache,
        slow_s=SLOW_S,
        after_epoch_start=(3, delay, kill_an_executor),
    )
    assert run.returncode == 0, run.events
    assert killed, "the executor kill never ran"
    moment, pid = killed[0]
    with contextlib.suppress(OSError):
        assert not Path(f"/proc/{pid}").exists(), "the executor survived SIGKILL"
    # inside epoch 3: it had started (the kill followed its start event) and committed after
    assert _committed_after(s3_store, 3, moment), "epoch 3 had committed before the kill"
    assert run.committed == list(range(1, EPOCHS + 1))  # each epoch committed once
    assert_same_as_reference(s3_store, reference)


def test_worker_killed_inside_an_epoch_loses_nothing(
    spark_cluster: LocalCluster,
    s3_store: str,
    cluster_data: str,
    reference: Repository,
    driver_cache: dict[str, str],
) -> None:
    killed: list[float] = []

    def kill_worker() -> None:
        assert spark_cluster.kill_worker(1), "worker 1 had no process to kill"
        killed.append(time.time())

    delay = 0.5 * SPLITS_PER_EPOCH * SLOW_S / 2
    try:
        run = _run(
            s3_store,
            cluster_data,
            spark_cluster,
            driver_cache,
            slow_s=SLOW_S,
            after_epoch_start=(2, delay, kill_worker),
        )
    finally:
        spark_cluster.start_worker(1)  # the next test has two workers again
    assert run.returncode == 0, run.events
    assert killed and _committed_after(s3_store, 2, killed[0]), "the kill was not inside epoch 2"
    assert run.committed == list(range(1, EPOCHS + 1))
    assert_same_as_reference(s3_store, reference)


def test_restart_with_no_state_cached_anywhere_restores_from_the_object_store(
    spark_cluster: LocalCluster,
    s3_store: str,
    cluster_data: str,
    reference: Repository,
    driver_cache: dict[str, str],
) -> None:
    first = _run(s3_store, cluster_data, spark_cluster, driver_cache, max_epochs=3)
    assert first.returncode == 0 and first.committed == [1, 2, 3], first.events
    # the restart runs where no executor (and no driver) has any of the state cached
    spark_cluster.wipe_state_caches()
    shutil.rmtree(driver_cache["EPOCHAL_STATE_CACHE_DIR"])
    second = _run(s3_store, cluster_data, spark_cluster, driver_cache, parallelism=2)
    assert second.returncode == 0, second.events
    assert second.committed == [4, 5, 6]
    chain = assert_same_as_reference(s3_store, reference)
    restored = chain[3].stats.get("restore_bytes", 0)
    assert restored > 0, f"epoch 4 restored nothing from the store: {chain[3].stats}"


def _set_parallelism(store: str, parallelism: int) -> None:
    repo = Repository.open(store, "crash")
    doc, version = repo.read_control("main")
    repo.write_control("main", {**doc, "parallelism": parallelism}, version)


def test_live_rescale_adds_and_removes_executors_and_restores_moved_key_groups(
    spark_cluster: LocalCluster,
    s3_store: str,
    cluster_data: str,
    reference: Repository,
    driver_cache: dict[str, str],
) -> None:
    """2 -> 3 -> 1 while the job runs: the pool asks the cluster for 3 executors (two workers of
    one core can give 2), then keeps 1; the executor left restores from the object store the
    key groups the removed one owned; the output equals the failure-free local run."""
    spark_cluster.wipe_state_caches()

    def rescale_to(p: int) -> Any:
        return lambda: _set_parallelism(s3_store, p)

    run = _run(
        s3_store,
        cluster_data,
        spark_cluster,
        driver_cache,
        slow_s=0.3,
        after_epoch_start=(2, 0.1, rescale_to(3)),  # applies from epoch 3
        after_second_epoch_start=(4, 0.1, rescale_to(1)),  # applies from epoch 5
    )
    assert run.returncode == 0, run.events
    chain = assert_same_as_reference(s3_store, reference)
    parallelism = [m.parallelism for m in chain]
    assert parallelism == [2, 2, 3, 3, 1, 1], parallelism
    pools = [m.extra["executors"] for m in chain]
    assert [p["requested"] for p in pools] == [2, 2, 3, 3, 1, 1], pools
    assert pools[4]["removing"] >= 1, pools  # the rescale to 1 removed an executor
    assert chain[4].stats.get("restore_bytes", 0) > 0, chain[4].stats
