"""Crash tests of the Iceberg, Redis Streams and RabbitMQ Streams sinks, all three in one job
(the job entry point, SIGKILLed as a process group) against the real services.

The job reads a Redis stream in bounded epochs and writes its output to the three sinks. It is
killed between the snapshot's CAS and the sinks' commits, inside an epoch after the sinks
staged its output (before its CAS), then inside the commit of each sink
in turn (the sinks' order changes between runs, so each is the first to commit once: Iceberg
dies with its data files written and the catalog not yet told, a log with a prefix of the epoch
published), and restarted each time, the last time at another parallelism. Each destination
then holds exactly the rows of a failure-free run, every epoch once.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runners.engine import EpochRunner
from runners.engine.destinations import build
from runners.engine.sinks import SINKS, Held, output_of
from snapshots_store import Repository
from tests.engine.crash_harness import random_kills, run_job
from tests.engine.destinations.conftest import cleanup, specs
from tests.engine.destinations.support import DESTINATIONS_ENV, JOB, contents
from tests.engine.jobs import STREAM_ENV, stream_job
from tests.engine.test_kafka_sink import output_by_epoch

pytestmark = [pytest.mark.spark, pytest.mark.services]

RECORDS, BATCH = 2_800, 200  # 7 epochs of 400 records


@pytest.fixture(scope="module")
def input_stream(redis_url: str) -> Iterator[str]:
    """A Redis stream of `RECORDS` {key, value} records: the source spec of `stream_job`."""
    import redis

    client = redis.Redis.from_url(redis_url)
    name = f"epochal-test-in-{uuid.uuid4().hex[:10]}"
    for first in range(0, RECORDS, BATCH):
        pipe = client.pipeline()
        for i in range(first, first + BATCH):
            pipe.xadd(name, {"data": json.dumps({"key": f"k{(i * 7) % 61}", "value": i % 997})})
        pipe.execute()
    yield f"redis:{redis_url}|{name}"
    client.delete(name, name + "#entries")


@pytest.fixture(scope="module")
def failure_free(
    spark: Any, input_stream: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[int, list[str]]:
    """The output per epoch of a run without failures (no sinks: the store's output)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(STREAM_ENV, input_stream)
        repo = Repository.open(f"file://{tmp_path_factory.mktemp('reference')}/store", "ref")
        EpochRunner(spark, stream_job(), repo=repo, parallelism=2).run()
    return output_by_epoch(repo)


def _order(made: list[dict[str, Any]], first: str) -> str:
    """The sinks' specs as JSON with sink `first` committing first."""
    ordered = sorted(made, key=lambda s: s["kind"] != first)
    return json.dumps(ordered)


def test_sigkill_around_and_inside_each_sink_commit_then_restart_equals_failure_free_run(
    tmp_path: Path, input_stream: str, failure_free: dict[int, list[str]],
    destinations: list[dict[str, Any]],
) -> None:  # fmt: skip
    _scenario(tmp_path, input_stream, failure_free, destinations, random=0)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [5, 6])
def test_sigkill_sweep_long(
    tmp_path: Path, input_stream: str, failure_free: dict[int, list[str]], catalog_uri: str,
    redis_url: str, rabbitmq_stream_url: str, seed: int,
) -> None:  # fmt: skip
    from runners.engine.rabbitmq_stream import create_stream

    made = specs(tmp_path, catalog_uri, redis_url, rabbitmq_stream_url,
                 redis_streams={"batch_size": 40}, rabbitmq_streams={"batch_size": 40})  # fmt: skip
    create_stream(made[2]["config"]["url"], made[2]["config"]["stream"])
    try:
        _scenario(tmp_path, input_stream, failure_free, made, random=3, seed=seed)
    finally:
        cleanup(made)


def _scenario(
    tmp_path: Path, input_stream: str, failure_free: dict[int, list[str]],
    made: list[dict[str, Any]], *, random: int, seed: int = 5,
) -> None:  # fmt: skip
    store = f"file://{tmp_path}/store"
    repo = Repository.open(store, "crash")
    sinks = {s["kind"]: build(s["name"], s["kind"], s["config"]) for s in made}

    def run(first: str = "iceberg", **kw: Any) -> Any:
        env = {STREAM_ENV: input_stream, DESTINATIONS_ENV: _order(made, first)}
        return run_job(store=store, namespace="crash", data="", job=JOB, extra_env=env, **kw)

    def held() -> dict[str, list[int]]:
        return {kind: sorted(contents(sink)) for kind, sink in sinks.items()}

    # between the snapshot's CAS and the sinks' commits: epoch 2 is in the store only
    killed = run(crash_at="after_cas:2")
    assert killed.killed and killed.head_epoch == 2, killed.events
    assert held() == {k: [1] for k in sinks}
    # inside epoch 3, its output staged (Iceberg's data files written), before its CAS: the
    # restart first finished epoch 2 everywhere
    killed = run(crash_at="after_prepare:3")
    assert killed.killed and killed.interrupted_epoch == 3, killed.events
    assert held() == {k: [1, 2] for k in sinks}
    # inside Iceberg's commit (its files written, the catalog not told)
    killed = run("iceberg", crash_at="mid_sink_commit:3")
    assert killed.killed and killed.head_epoch == 3, killed.events
    assert held() == {k: [1, 2] for k in sinks}
    # inside Redis's commit: its first batch of epoch 4 is in the stream
    killed = run("redis_streams", crash_at="mid_sink_commit:4")
    assert killed.killed and killed.head_epoch == 4, killed.events
    redis_now = contents(sinks["redis_streams"])
    assert sorted(redis_now) == [1, 2, 3, 4] and len(redis_now[4]) == 40
    assert held()["iceberg"] == held()["rabbitmq_streams"] == [1, 2, 3]
    # inside RabbitMQ's commit: its first batch of epoch 5 is in the stream
    killed = run("rabbitmq_streams", crash_at="mid_sink_commit:5")
    assert killed.killed and killed.head_epoch == 5, killed.events
    rabbit_now = contents(sinks["rabbitmq_streams"])
    assert sorted(rabbit_now) == [1, 2, 3, 4, 5] and len(rabbit_now[5]) == 40
    assert held()["iceberg"] == held()["redis_streams"] == [1, 2, 3, 4]
    for n, delay in random_kills(random, seed=seed):  # at random moments inside an epoch
        killed = run(kill_after_epoch_start=(n, delay))
        assert killed.killed, killed.events
    final = run(parallelism=3)
    assert final.returncode == 0, final.events

    chain = [m for _, m in repo.log("heads/main", first_parent=True)]
    assert sum(int(m.stats["records_in"]) for m in chain) == RECORDS  # none lost, none twice
    assert output_by_epoch(repo) == failure_free
    for kind, sink in sinks.items():
        assert contents(sink) == failure_free, kind  # every epoch once, nothing of the kills
        sink.close()

    # the head's record: each destination says it holds the head, and repeating the head's
    # commit in a new process (a retried second phase) adds nothing
    head = repo.resolve("main")
    manifest = repo.read_manifest(head)
    for spec in made:
        entry = manifest.extra[SINKS][spec["name"]]
        sink = build(spec["name"], spec["kind"], spec["config"])
        assert sink.committed(entry["staged"]) == Held(manifest.epoch, head), spec["kind"]
        sink.commit(output_of(repo, "crash", manifest, head, entry), entry["staged"])
        assert contents(sink) == failure_free, spec["kind"]
        sink.close()
