"""Crash tests of the log sources: while a producer keeps publishing, SIGKILL the job entry
point at random moments inside an epoch (the killed run's last event is an `epoch_start` it
never finished), restart it each time, the last time at another parallelism, and require the
branch to equal a failure-free run over the same messages: nothing lost, nothing twice."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from runners.engine import EpochRunner, read_output
from runners.engine.rabbitmq_stream import create_stream, delete_stream, publish
from snapshots_store import Repository
from tests.engine.crash_harness import random_kills, run_job
from tests.engine.jobs import STREAM_ENV, stream_job

pytestmark = [pytest.mark.spark, pytest.mark.services]

STREAMS, BEFORE, DURING, BATCH = 2, 600, 900, 50  # records per stream
JOB = "stream-job"


def _batch(stream: int, first: int) -> list[dict[str, Any]]:
    return [
        {"key": f"s{stream}-k{(i * 7) % 97}", "value": (i * 31 + stream) % 1000}
        for i in range(first, first + BATCH)
    ]


@pytest.fixture(params=["redis", "rabbitmq"])
def log(request: pytest.FixtureRequest) -> Iterator[tuple[str, Callable[[str, list[Any]], None]]]:
    """(source spec prefix, publish(stream, records)) of a real broker; streams are removed."""
    names = [f"epochal-crash-{uuid.uuid4().hex[:8]}-{i}" for i in range(STREAMS)]
    if request.param == "redis":
        import redis

        url = request.getfixturevalue("redis_url")
        client = redis.Redis.from_url(url)

        def send(stream: str, records: list[Any]) -> None:
            pipe = client.pipeline()
            for r in records:
                pipe.xadd(stream, {"data": json.dumps(r)})
            pipe.execute()

        yield f"redis:{url}|{','.join(names)}", send
        client.delete(*names)
    else:
        url = request.getfixturevalue("rabbitmq_stream_url")
        for name in names:
            create_stream(url, name)

        def send(stream: str, records: list[Any]) -> None:
            publish(url, stream, records)

        yield f"rabbitmq:{url}|{','.join(names)}", send
        for name in names:
            delete_stream(url, name)


def _state(repo: Repository, branch: str = "main") -> pd.DataFrame:
    """The latest output row of every key (what the branch says about each key)."""
    frame = read_output(repo, branch).to_pandas()
    latest = frame.sort_values("_epoch").groupby("key").last().drop(columns="_epoch")
    return latest.sort_index()


def test_sigkill_inside_an_epoch_while_publishing_then_restart_equals_failure_free_run(
    spark: Any,
    tmp_path: Path,
    log: tuple[str, Callable[[str, list[Any]], None]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # one kill and one restart at another parallelism per broker: the done criterion
    # at the least CI cost (two job processes per broker); the slow sweep kills more often
    _sweep(spark, tmp_path, log, monkeypatch, kills=1, seed=19)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [20, 21])
def test_sigkill_sweep_long(
    spark: Any,
    tmp_path: Path,
    log: tuple[str, Callable[[str, list[Any]], None]],
    monkeypatch: pytest.MonkeyPatch,
    seed: int,
) -> None:
    _sweep(spark, tmp_path, log, monkeypatch, kills=4, seed=seed)


def _sweep(
    spark: Any,
    tmp_path: Path,
    log: tuple[str, Callable[[str, list[Any]], None]],
    monkeypatch: pytest.MonkeyPatch,
    *,
    kills: int,
    seed: int,
) -> None:
    spec, send = log
    names = spec.rpartition("|")[2].split(",")
    for s, name in enumerate(names):
        for first in range(0, BEFORE, BATCH):
            send(name, _batch(s, first))

    def produce() -> None:  # keeps publishing while the job is killed and restarted
        for first in range(BEFORE, BEFORE + DURING, BATCH):
            for s, name in enumerate(names):
                send(name, _batch(s, first))
            time.sleep(0.4)

    producer = threading.Thread(target=produce, name="producer")
    producer.start()
    store = f"file://{tmp_path}/store"
    env = {STREAM_ENV: spec}
    try:
        for n, delay in random_kills(kills, seed=seed):
            run = run_job(store=store, namespace="crash", data="", job=JOB, extra_env=env,
                          kill_after_epoch_start=(n, delay))  # fmt: skip
            assert run.killed, run.events
            # provably inside an epoch: announced as the run's last event, not on the branch
            assert run.interrupted_epoch is not None, (run.events, run.head_epoch)
    finally:
        producer.join()
    final = run_job(store=store, namespace="crash", data="", job=JOB, extra_env=env,
                    parallelism=3)  # fmt: skip
    assert final.returncode == 0, final.events
    repo = Repository.open(store, "crash")

    # the failure-free run over the same messages (a key lives in one stream, so `last` is
    # the same whatever records the epochs were cut into)
    monkeypatch.setenv(STREAM_ENV, spec)
    reference = Repository.open(f"file://{tmp_path}/reference", "crash")
    EpochRunner(spark, stream_job(), repo=reference, parallelism=2).run()

    total = STREAMS * (BEFORE + DURING)
    chain = [m for _, m in repo.log("heads/main", first_parent=True)]
    assert sum(int(m.stats["records_in"]) for m in chain) == total  # none lost, none twice
    assert sorted(m.epoch for m in chain) == list(range(1, len(chain) + 1))
    head = repo.read_manifest(repo.resolve("main"))
    ref_head = reference.read_manifest(reference.resolve("main"))
    assert head.offsets == ref_head.offsets
    pd.testing.assert_frame_equal(_state(repo), _state(reference))
    assert int(_state(repo)["count"].sum()) == total
