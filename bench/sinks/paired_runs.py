"""The cost of one sink, measured the same way for every destination of ours (Iceberg, Redis
Streams, RabbitMQ Streams): the same job over the same generated epochs, in the same process
and SparkSession, without the sink and with it, alternately, `runs` times.

The job is the engine's keyed running aggregate (count, sum, max of ``value`` per ``key``) over
`runners.engine.sources.Generator` epochs with ``records_per_epoch // 10`` keys, so an epoch
outputs about as many rows as there are keys (each a row the sink publishes).

- ``records_per_s_with_sink`` / ``..._without_sink``: input records over the wall time of the
  run's epochs (the medians over the runs), ``ratio_with_sink`` their quotient;
- ``sink_commit_p50_ms`` / ``p99_ms``: the sink's ``commit`` (after the snapshot's CAS), and
  ``sink_prepare_p50_ms`` its ``prepare`` (before the CAS), over every epoch of every run;
- ``exactly_once_checked``: after every run with the sink, the destination's rows per epoch
  (`published`, everything it holds) equal the store's output per epoch, as multisets.

A warm-up run of one small epoch each way comes first (JVM, Python workers, clients).
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

#: builds a fresh destination for one run: (kind, config, cleanup)
Destination = Callable[[str], tuple[str, dict[str, Any], Callable[[], None]]]


class TimedSink:
    """Delegates to a sink and records how long its prepare and commit took. It is a
    `Rederives` sink like the ones it wraps, so the engine drives it as it drives them: on
    the catch-up driver, the commit overlapping the next epoch's tasks."""

    def __init__(self, sink: Any) -> None:
        self.sink, self.name = sink, sink.name
        self.prepare_ms: list[float] = []
        self.commit_ms: list[float] = []

    def prepare(self, output: Any) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            return dict(self.sink.prepare(output))
        finally:
            self.prepare_ms.append((time.perf_counter() - started) * 1000)

    def commit(self, output: Any, pending: Mapping[str, Any]) -> None:
        started = time.perf_counter()
        try:
            self.sink.commit(output, pending)
        finally:
            self.commit_ms.append((time.perf_counter() - started) * 1000)

    def committed(self, pending: Mapping[str, Any]) -> Any:
        return self.sink.committed(pending)

    def rollback_to(self, epoch: int, *, namespace: str, branch: str) -> None:
        self.sink.rollback_to(epoch, namespace=namespace, branch=branch)

    def forget_staged(self) -> None:
        self.sink.forget_staged()


def _job(records_per_epoch: int, epochs: int, sinks: list[Any]) -> Any:
    from runners.engine import Job
    from runners.engine import aggregations as agg
    from runners.engine.sources import Generator

    source = Generator(keys=max(1, records_per_epoch // 10), records_per_epoch=records_per_epoch,
                       seed=11, epochs=epochs)  # fmt: skip
    return Job(name="sink-bench", source=source, key="key", sinks=sinks,
               aggregate=[agg.count(), agg.sum("value"), agg.max("value")])  # fmt: skip


def _run(spark: Any, store: Path, records_per_epoch: int, epochs: int,
         sinks: list[Any]) -> tuple[float, Any]:  # fmt: skip
    """(seconds, repository) of one run of the job to its end, in a fresh store."""
    from runners.engine import EpochRunner
    from snapshots_store import Repository

    shutil.rmtree(store, ignore_errors=True)
    repo = Repository.open(f"file://{store}", "bench")
    runner = EpochRunner(spark, _job(records_per_epoch, epochs, sinks), repo=repo, parallelism=2)
    started = time.perf_counter()
    results = runner.run()
    seconds = time.perf_counter() - started
    assert len(results) == epochs, f"{len(results)} epochs ran, not {epochs}"
    return seconds, repo


def _rows(rows_by_epoch: Mapping[int, list[dict[str, Any]]]) -> dict[int, Counter[tuple]]:
    return {e: Counter(tuple(sorted(r.items())) for r in rows) for e, rows in rows_by_epoch.items()}


def exactly_once(sink: Any, repo: Any) -> bool:
    """Whether the destination holds exactly the store's output, epoch by epoch."""
    from runners.engine import read_output

    store: dict[int, list[dict[str, Any]]] = {}
    for row in read_output(repo, "main").to_pylist():
        store.setdefault(int(row.pop("_epoch")), []).append(row)
    return _rows(sink.published()) == _rows(store)


def measure_sink(
    destination: Destination, *, records_per_epoch: int, epochs: int, workdir: Path,
    target: float, runs: int = 2,
) -> dict[str, Any]:  # fmt: skip
    """One destination's figures (see the module docstring)."""
    from runners.engine.destinations import build
    from runners.engine.session import build_spark_session

    spark = build_spark_session(app_name="bench-sinks")
    loads = {"start": list(os.getloadavg())}
    without: list[float] = []
    with_sink: list[float] = []
    prepare_ms: list[float] = []
    commit_ms: list[float] = []
    checks: list[bool] = []
    kind = ""
    for n in range(runs + 1):  # run 0: the warm-up, one small epoch each way
        per_epoch, count = (records_per_epoch, epochs) if n else (1_000, 1)
        seconds, _ = _run(spark, workdir / "without", per_epoch, count, [])
        kind, config, cleanup = destination(f"r{n}")
        sink = TimedSink(build(f"bench-{n}", kind, config))
        try:
            seconds_with, repo = _run(spark, workdir / "with", per_epoch, count, [sink])
            if n:
                without.append(seconds)
                with_sink.append(seconds_with)
                prepare_ms += sink.prepare_ms
                commit_ms += sink.commit_ms
                checks.append(exactly_once(sink.sink, repo))
                loads[f"run{n}"] = list(os.getloadavg())
        finally:
            sink.sink.close()
            cleanup()
    records = records_per_epoch * epochs
    rate_without = records / statistics.median(without)
    rate_with = records / statistics.median(with_sink)
    ratio = rate_with / rate_without
    p50, p99 = np.percentile(commit_ms, [50, 99])
    return {
        "kind": kind,
        "records_per_epoch": records_per_epoch,
        "epochs": epochs,
        "keys": max(1, records_per_epoch // 10),
        "runs": runs,
        "records_per_s_with_sink": round(rate_with, 1),
        "records_per_s_without_sink": round(rate_without, 1),
        "ratio_with_sink": round(ratio, 3),
        "ratio_with_sink_per_run": [
            round(a / b, 3) for a, b in zip(without, with_sink, strict=True)
        ],
        "sink_commit_p50_ms": round(float(p50), 1),
        "sink_commit_p99_ms": round(float(p99), 1),
        "sink_prepare_p50_ms": round(float(np.percentile(prepare_ms, 50)), 1),
        "exactly_once_checked": all(checks),
        "target": {"ratio_with_sink": target},
        "target_met": ratio >= target,
        "loadavg": {**loads, "end": list(os.getloadavg())},
    }


__all__ = ["Destination", "TimedSink", "exactly_once", "measure_sink"]
