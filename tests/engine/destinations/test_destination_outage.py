"""The three destinations unreachable for a while, against real servers: the Redis server, the
RabbitMQ broker and the Iceberg catalog's PostgreSQL each behind a TCP proxy of the test's
own that it cuts (the shared servers are never stopped: other engineers use them).

Iceberg and the log sinks follow the branch on the catch-up driver: while a destination is
down the job goes on committing snapshots and the sink's lag grows (each epoch's stats); a
restart while it is still down starts and goes on too; once it is back the sink catches up in
order, each missed epoch committed from the snapshot's pending record and the store's output,
and every destination holds every epoch once — the store's output, which a failure-free run
publishes. A rollback while the sinks lag is followed too: the abandoned epoch, never
published, is never published; the table and the logs hold the new first-parent chain.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from runners.engine import EpochRunner, sources
from runners.engine.destinations import build
from runners.engine.rabbitmq_stream import create_stream
from snapshots_store import Repository
from tests.engine.destinations.conftest import cleanup, specs
from tests.engine.destinations.support import TcpProxy, contents
from tests.engine.jobs import aggregate_job
from tests.engine.test_kafka_sink import output_by_epoch

pytestmark = [pytest.mark.spark, pytest.mark.services]

NAMES = ("iceberg", "redis", "rabbitmq")


class Behind:
    """The destinations of the three sinks, each reached through a proxy the test cuts."""

    def __init__(self, tmp: Path, catalog_uri: str, redis_url: str, rabbitmq_url: str) -> None:
        self.direct = specs(tmp, catalog_uri, redis_url, rabbitmq_url)
        self.proxies = [_proxy(catalog_uri, 5432), _proxy(redis_url, 6379),
                        _proxy(rabbitmq_url, 5552)]  # fmt: skip
        urls = (catalog_uri, redis_url, rabbitmq_url)
        via = [_via(url, proxy) for url, proxy in zip(urls, self.proxies, strict=True)]
        through: list[dict[str, Any]] = [
            {"catalog_uri": via[0]}, {"url": via[1]}, {"url": via[2], "load_balancer": True},
        ]  # fmt: skip
        self.made = [{**s, "config": {**s["config"], **extra}}
                     for s, extra in zip(self.direct, through, strict=True)]  # fmt: skip
        create_stream(rabbitmq_url, self.direct[2]["config"]["stream"])

    def sinks(self) -> list[Any]:
        return [build(s["name"], s["kind"], s["config"]) for s in self.made]

    def cut(self) -> None:
        for proxy in self.proxies:
            proxy.cut()

    def restore(self) -> None:
        for proxy in self.proxies:
            proxy.restore()

    def contents(self) -> dict[str, dict[int, list[str]]]:
        found = {}
        for spec in self.direct:
            sink = build(spec["name"], spec["kind"], spec["config"])
            found[spec["name"]] = contents(sink)
            sink.close()
        return found

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.close()
        cleanup(self.direct)


def _proxy(url: str, default_port: int) -> TcpProxy:
    parts = urlsplit(url.replace("postgresql+psycopg", "postgresql"))
    return TcpProxy((parts.hostname or "127.0.0.1", parts.port or default_port))


def _via(url: str, proxy: TcpProxy) -> str:
    """`url` with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return url.replace(f"@{host}" if "@" in parts.netloc else f"//{host}",
                       f"@127.0.0.1:{proxy.port}" if "@" in parts.netloc
                       else f"//127.0.0.1:{proxy.port}", 1)  # fmt: skip


@pytest.fixture
def behind(
    tmp_path: Path, catalog_uri: str, redis_url: str, rabbitmq_stream_url: str
) -> Iterator[Behind]:
    made = Behind(tmp_path, catalog_uri, redis_url, rabbitmq_stream_url)
    yield made
    made.close()


def _stop(runner: EpochRunner) -> None:
    """Wait for the runner's sink writes and close its sinks (a job's process ending)."""
    runner.follower.settle()
    for sink in runner.job.sinks:
        sink.close()


def _lags(repo: Repository) -> dict[str, Any]:
    stats = repo.read_manifest(repo.resolve("main")).stats
    return {name: stats.get(f"sink_lag_epochs.{name}") for name in NAMES}


def test_destinations_down_the_job_commits_the_sinks_lag_then_catch_up_once(
    spark: Any, tmp_path: Path, epochs_dir: str, behind: Behind
) -> None:
    repo = Repository.open(f"file://{tmp_path}/store", "outage")

    def runner() -> EpochRunner:
        return EpochRunner(spark, aggregate_job(epochs_dir, sinks=behind.sinks()), repo=repo)

    first = runner()
    assert first.run_epoch() is not None
    first.follower.settle()
    assert {n: sorted(c) for n, c in behind.contents().items()} == {name: [1] for name in NAMES}
    behind.cut()
    for _ in range(3):  # down: the job goes on committing snapshots
        assert first.run_epoch() is not None
    assert repo.read_manifest(repo.resolve("main")).epoch == 4
    assert _lags(repo) == dict.fromkeys(NAMES, 2)  # epochs 2 and 3 missing when 4 committed
    assert repo.read_manifest(repo.resolve("main")).stats["sink_lag_s"] > 0
    _stop(first)

    again = runner()  # a restart while they are still down starts and goes on
    assert again.run_epoch() is not None  # epoch 5
    assert _lags(repo) == dict.fromkeys(NAMES, 4)  # the run has not reached them: 1 to 4
    again.follower.settle()
    assert {n: sorted(c) for n, c in behind.contents().items()} == {name: [1] for name in NAMES}

    behind.restore()
    again.follower.follow(repo.resolve("main"), force=True)  # the retry after the outage
    assert not again.follower.behind()
    assert again.run_epoch() is not None  # epoch 6, after 2 to 5 in order
    again.follower.settle()
    assert again.follower.lag_stats()["sink_lag_epochs"] == 0
    _stop(again)
    expected = output_by_epoch(repo)
    assert sorted(expected) == [1, 2, 3, 4, 5, 6]
    assert behind.contents() == {name: expected for name in NAMES}  # nothing lost or doubled


def test_a_rollback_while_the_sinks_lag_publishes_the_new_chain_only(
    spark: Any, tmp_path: Path, epochs_dir: str, behind: Behind
) -> None:
    repo = Repository.open(f"file://{tmp_path}/store", "lagging-rollback")
    job = aggregate_job(epochs_dir, sinks=behind.sinks())
    runner = EpochRunner(spark, job, repo=repo)
    assert runner.run_epoch() is not None
    runner.follower.settle()
    behind.cut()
    assert runner.run_epoch() is not None and runner.run_epoch() is not None  # epochs 2, 3
    _stop(runner)
    old = output_by_epoch(repo)
    chain = {m.epoch: sid for sid, m in repo.log("heads/main", first_parent=True)}
    repo.cas_ref("heads/main", chain[3], chain[2], reason="rollback to epoch 2")  # confirmed

    behind.restore()  # the job goes on with another epoch size: a new epoch 3
    source = sources.ParquetDirectory(epochs_dir, max_files_per_epoch=2, rows_per_split=700)
    job = aggregate_job(epochs_dir, source=source, sinks=behind.sinks())
    again = EpochRunner(spark, job, repo=repo)
    assert [r.epoch for r in again.run(max_epochs=2)] == [3, 4]
    _stop(again)
    expected = output_by_epoch(repo)
    assert sorted(expected) == [1, 2, 3, 4] and expected[3] != old[3]
    # the abandoned epoch 3 was never published: the logs hold the new chain alone, like the
    # table (which would have gone back had it held it)
    assert behind.contents() == {name: expected for name in NAMES}
