"""Crash tests of Kafka in, Kafka out (the exactly-once sink) against the real broker.

While a producer keeps writing to the input topic, the job entry point is SIGKILLed between
the snapshot's CAS and the Kafka commit, inside the Kafka commit (one part committed, the other
not), right after the epoch's transactions were prepared, and at a random moment inside an
epoch; it is restarted each time, the last time at another parallelism. The sink topic read
with ``read_committed`` then holds every epoch of the branch exactly once (nothing of the
killed attempts), and its latest row per key equals a failure-free run's. A broker of the
test's own (never the shared one) is also killed and restarted while the job runs.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runners.engine import EpochRunner
from runners.engine.kafka_client import (
    admin_types,
    create_topic,
    delete_topics,
    forget,
    publish,
)
from runners.engine.kafka_sink import KafkaSink
from snapshots_store import Repository
from tests.engine.crash_harness import head_epoch, run_job
from tests.engine.crash_harness import random_kills as kill_times
from tests.engine.jobs import SINK_ENV, STREAM_ENV, stream_sink_job
from tests.engine.kafka_broker import PrivateBroker, broker_lib
from tests.engine.test_kafka_sink import by_epoch, output_by_epoch

pytestmark = [pytest.mark.spark, pytest.mark.services]

PARTITIONS, BEFORE, DURING, BATCH = 2, 600, 900, 50  # records per input partition
JOB = "stream-sink-job"


def _batch(partition: int, first: int) -> list[dict[str, Any]]:
    return [
        {"key": f"s{partition}-k{(i * 7) % 97}", "value": (i * 31 + partition) % 1000}
        for i in range(first, first + BATCH)
    ]


@pytest.fixture
def kafka_topics(kafka_bootstrap: str) -> Iterator[tuple[str, str, str]]:
    """(input topic, sink topic, reference sink topic), deleted after the test."""
    name = f"epochal-crash-{uuid.uuid4().hex[:8]}"
    made = [f"{name}-in", f"{name}-out", f"{name}-ref"]
    for topic in made:
        create_topic(kafka_bootstrap, topic, PARTITIONS)
    yield made[0], made[1], made[2]
    delete_topics(kafka_bootstrap, made)


def settled(servers: str, topic: str, timeout: float = 30.0) -> None:
    """Wait until no transaction is open on the topic (its last stable offsets reach the
    ends): one a killed run left open is aborted by a restart with the same ids, or by the
    broker after the sink's transaction timeout."""
    from confluent_kafka import IsolationLevel, TopicPartition

    from runners.engine.kafka_client import ask

    spec = admin_types().OffsetSpec.latest()
    request = {TopicPartition(topic, p): spec for p in range(PARTITIONS)}
    deadline = time.monotonic() + timeout
    while True:
        ends = [
            {k.partition: v.offset for k, v in ask(servers, None, lambda client, level=level:
                client.list_offsets(request, isolation_level=level), "ends of").items()}
            for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED)
        ]  # fmt: skip
        if ends[0] == ends[1]:
            return
        assert time.monotonic() < deadline, f"transactions still open on {topic}: {ends}"
        time.sleep(0.2)


def _latest(epochs: dict[int, list[str]]) -> dict[str, dict[str, Any]]:
    """The last row per key over a topic's epochs."""
    out: dict[str, dict[str, Any]] = {}
    for epoch in sorted(epochs):
        for text in epochs[epoch]:
            row = json.loads(text)
            out[row["key"]] = row
    return out


def test_sigkill_around_the_kafka_commit_while_producing_then_restart_equals_failure_free_run(
    spark: Any, tmp_path: Path, kafka_bootstrap: str, kafka_topics: tuple[str, str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    # the three named kills and a restart at another parallelism: four job processes
    _scenario(spark, tmp_path, kafka_bootstrap, kafka_topics, monkeypatch, random_kills=0)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [23, 24])
def test_sigkill_sweep_long(
    spark: Any, tmp_path: Path, kafka_bootstrap: str, kafka_topics: tuple[str, str, str],
    monkeypatch: pytest.MonkeyPatch, seed: int,
) -> None:  # fmt: skip
    _scenario(spark, tmp_path, kafka_bootstrap, kafka_topics, monkeypatch, random_kills=3,
              seed=seed)  # fmt: skip


def _scenario(
    spark: Any, tmp_path: Path, kafka_bootstrap: str, kafka_topics: tuple[str, str, str],
    monkeypatch: pytest.MonkeyPatch, *, random_kills: int, seed: int = 23,
) -> None:  # fmt: skip
    source, sink, reference_sink = kafka_topics
    for p in range(PARTITIONS):
        for first in range(0, BEFORE, BATCH):
            publish(kafka_bootstrap, source, _batch(p, first), partition=p)

    def produce() -> None:  # keeps writing while the job is killed and restarted
        for first in range(BEFORE, BEFORE + DURING, BATCH):
            for p in range(PARTITIONS):
                publish(kafka_bootstrap, source, _batch(p, first), partition=p)
            time.sleep(0.4)

    producer = threading.Thread(target=produce, name="producer")
    producer.start()
    store = f"file://{tmp_path}/store"
    env = {STREAM_ENV: f"kafka:{kafka_bootstrap}|{source}", SINK_ENV: f"{kafka_bootstrap}|{sink}"}
    repo = Repository.open(store, "crash")
    probe = KafkaSink(kafka_bootstrap, sink)

    def marker(first: int, last: int) -> int | None:
        held = probe._held(probe.marker_group("crash", "main", first, last))
        return None if held is None else held.epoch

    def run(**kw: Any) -> Any:
        return run_job(store=store, namespace="crash", data="", job=JOB, extra_env=env, **kw)

    try:
        # between the snapshot's CAS and the Kafka commit: epoch 2 is on the branch only
        killed = run(crash_at="after_cas:2")
        assert killed.killed and killed.head_epoch == 2, killed.events
        assert set(by_epoch(kafka_bootstrap, sink)) == {1}
        assert (marker(0, 63), marker(64, 127)) == (1, 1)
        # inside the Kafka commit: the restart finished epoch 2, then died after the first
        # part of epoch 4 committed
        killed = run(crash_at="mid_sink_commit:4")
        assert killed.killed and killed.head_epoch == 4, killed.events
        assert (marker(0, 63), marker(64, 127)) == (4, 3)
        # after the epoch's transactions were prepared, before its CAS
        killed = run(crash_at="after_prepare:5")
        assert killed.killed and killed.interrupted_epoch == 5, killed.events
        assert 5 in by_epoch(kafka_bootstrap, sink, "read_uncommitted")  # staged in the log
        assert 5 not in by_epoch(kafka_bootstrap, sink)  # but not visible
        assert (marker(0, 63), marker(64, 127)) == (4, 4)  # the restart finished epoch 4
        # at random moments inside an epoch
        for n, delay in kill_times(random_kills, seed=seed):
            killed = run(kill_after_epoch_start=(n, delay))
            assert killed.killed and killed.interrupted_epoch is not None, killed.events
    finally:
        producer.join()
    final = run(parallelism=3)
    assert final.returncode == 0, final.events

    total = PARTITIONS * (BEFORE + DURING)
    chain = [m for _, m in repo.log("heads/main", first_parent=True)]
    assert sum(int(m.stats["records_in"]) for m in chain) == total  # none lost, none twice
    settled(kafka_bootstrap, sink)
    published = by_epoch(kafka_bootstrap, sink)
    assert published == output_by_epoch(repo)  # every epoch once, no killed attempt's records

    # the failure-free run over the same records, into its own sink topic
    monkeypatch.setenv(STREAM_ENV, env[STREAM_ENV])
    monkeypatch.setenv(SINK_ENV, f"{kafka_bootstrap}|{reference_sink}")
    reference = Repository.open(f"file://{tmp_path}/reference", "crash")
    EpochRunner(spark, stream_sink_job(), repo=reference, parallelism=2).run()
    expected = by_epoch(kafka_bootstrap, reference_sink)
    assert expected == output_by_epoch(reference)
    assert _latest(published) == _latest(expected)
    assert sum(int(r["count"]) for r in _latest(published).values()) == total


@pytest.fixture
def private_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateBroker]:
    """A broker of the test's own, which the test kills and restarts."""
    from tests.conftest import require_service

    lib = broker_lib()
    require_service(
        "the Kafka broker's jars",
        lib is not None,
        "run `bin/services up` (it fetches them into var/cache/kafka) or set EPOCHAL_KAFKA_LIB",
    )
    assert lib is not None
    broker = PrivateBroker(lib, tmp_path_factory.mktemp("broker"))
    broker.start()
    yield broker
    broker.kill()
    forget(broker.servers)  # its admin client would retry the dead broker until the end


def test_broker_killed_and_restarted_while_the_job_runs_loses_and_doubles_nothing(
    tmp_path: Path, private_broker: PrivateBroker
) -> None:
    servers = private_broker.servers
    source, sink = "clicks", "totals"
    create_topic(servers, source, PARTITIONS)
    create_topic(servers, sink, PARTITIONS)
    for p in range(PARTITIONS):
        for first in range(0, BEFORE + DURING, BATCH):
            publish(servers, source, _batch(p, first), partition=p)
    store = f"file://{tmp_path}/store"
    env = {STREAM_ENV: f"kafka:{servers}|{source}", SINK_ENV: f"{servers}|{sink}"}
    seen: list[int] = []

    def outage() -> None:  # once epoch 1 is committed, the broker goes away for a while
        deadline = time.monotonic() + 180
        while head_epoch(store, "outage") < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        seen.append(head_epoch(store, "outage"))
        private_broker.kill()
        time.sleep(3)
        private_broker.start()

    chaos = threading.Thread(target=outage, name="broker-outage")
    chaos.start()
    runs = [run_job(store=store, namespace="outage", data="", job=JOB, extra_env=env)]
    chaos.join()
    while runs[-1].returncode != 0 and len(runs) < 4:  # a run the outage failed: restart it
        runs.append(run_job(store=store, namespace="outage", data="", job=JOB, extra_env=env,
                            parallelism=3))  # fmt: skip
    assert runs[-1].returncode == 0, [r.events[-3:] for r in runs]
    assert seen and seen[0] >= 1 and runs[-1].head_epoch > seen[0]  # epochs after the outage

    repo = Repository.open(store, "outage")
    total = PARTITIONS * (BEFORE + DURING)
    chain = [m for _, m in repo.log("heads/main", first_parent=True)]
    assert sum(int(m.stats["records_in"]) for m in chain) == total
    settled(servers, sink)
    published = by_epoch(servers, sink)
    assert published == output_by_epoch(repo)
    latest = _latest(published)
    assert sum(int(r["count"]) for r in latest.values()) == total
    expected: dict[str, int] = {}
    for p in range(PARTITIONS):
        for first in range(0, BEFORE + DURING, BATCH):
            for r in _batch(p, first):
                expected[r["key"]] = expected.get(r["key"], 0) + r["value"]
    assert {k: int(r["sum_value"]) for k, r in latest.items()} == expected
