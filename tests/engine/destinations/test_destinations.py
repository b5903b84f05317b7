"""The three destinations in one job against the real services: every epoch lands once in an
Iceberg table, a Redis stream and a RabbitMQ stream, with the epoch and the store snapshot
recorded where a retry finds them; a repeated commit adds nothing."""

from __future__ import annotations

from typing import Any

import pytest

from runners.engine import EpochRunner
from runners.engine.destinations import build
from runners.engine.sinks import SINKS, Held, output_of
from snapshots_store import Repository
from tests.engine.destinations.support import contents
from tests.engine.jobs import aggregate_job
from tests.engine.test_kafka_sink import output_by_epoch

pytestmark = [pytest.mark.spark, pytest.mark.services]


def test_every_epoch_lands_once_and_a_repeated_commit_adds_nothing(
    spark: Any, repo: Repository, epochs_dir: str, destinations: list[dict[str, Any]]
) -> None:
    sinks = [build(s["name"], s["kind"], s["config"]) for s in destinations]
    runner = EpochRunner(spark, aggregate_job(epochs_dir, sinks=sinks), repo=repo)
    results = [runner.run_epoch() for _ in range(3)]
    assert all(r is not None for r in results)
    expected = output_by_epoch(repo)
    assert set(expected) == {1, 2, 3}
    for sink in sinks:
        assert contents(sink) == expected, sink.name

    head = repo.resolve("main")
    manifest = repo.read_manifest(head)
    namespace = runner.namespace
    for spec, sink in zip(destinations, sinks, strict=True):
        entry = manifest.extra[SINKS][sink.name]
        assert sink.committed(entry["staged"]) == Held(3, head), sink.name
        sink.close()
        # a new process finding the head's pending record repeats the commit: nothing changes
        fresh = build(spec["name"], spec["kind"], spec["config"])
        fresh.commit(output_of(repo, namespace, manifest, head, entry), entry["staged"])
        assert contents(fresh) == expected, sink.name
        fresh.close()
