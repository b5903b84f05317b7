"""What every destination's part of `python -m bench.sinks` shares: the same job over the same
generated records, once without sinks and once with the destination's sink, in one process
and one SparkSession; timings of the sink's per-epoch write; the exactly-once check.

The job is the benchmarks' running aggregate (``count``, ``sum``, ``max`` of ``value`` per
``key``) over the deterministic generator, so each epoch's output is one row per key changed
in that epoch (most of the keys at these sizes). ``records_per_s_*`` = input records over the
summed epoch times (`EpochResult.duration_s`: from planning to the end of the second phase,
so the sink's commit is inside it). ``sink_commit_*_ms`` time the destination's write of one
epoch (reading the epoch's output back from the store included). ``exactly_once_checked`` is
true when, per epoch, the checksum (bench/checksum.py) of the destination's rows equals that
of the epoch's output in the store, and the destination holds no other epoch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from bench.checksum import checksum_arrow
from runners.engine import EpochRunner, Job
from runners.engine import aggregations as agg
from runners.engine.output import EPOCH, read_output
from runners.engine.session import build_spark_session
from runners.engine.sinks import EpochOutput, Held
from runners.engine.sources import Generator
from snapshots_store import Repository

KEYS_PER_RECORD = 0.5  # distinct keys of the generator per record of an epoch
TARGET_RATIO = 0.8


def bench_job(records_per_epoch: int, epochs: int, sinks: Sequence[Any] = ()) -> Job:
    keys = max(1, int(records_per_epoch * KEYS_PER_RECORD))
    source = Generator(
        keys=keys,
        records_per_epoch=records_per_epoch,
        epochs=epochs,
        seed=11,
        rows_per_split=250_000,
    )
    job = Job(
        name="bench-sinks",
        source=source,
        key="key",
        aggregate=[agg.count(), agg.sum("value"), agg.max("value")],
    )
    return replace(job, sinks=list(sinks))


@dataclass
class Timed:
    """A chain sink whose epoch writes are timed (delegates everything to `sink`)."""

    sink: Any
    write_ms: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.sink.name)

    def held(self, writer: str) -> Held | None:
        return self.sink.held(writer)  # type: ignore[no-any-return]

    def snapshot_of(self, writer: str, epoch: int) -> str | None:
        return self.sink.snapshot_of(writer, epoch)  # type: ignore[no-any-return]

    def write(self, writer: str, output: EpochOutput) -> None:
        started = time.perf_counter()
        self.sink.write(writer, output)
        self.write_ms.append((time.perf_counter() - started) * 1000)

    def rewind(
        self, writer: str, epoch: int, snapshot_id: str | None, replay: Sequence[EpochOutput]
    ) -> None:
        self.sink.rewind(writer, epoch, snapshot_id, replay)

    def prepare(self, output: EpochOutput) -> dict[str, Any]:
        return self.sink.prepare(output)  # type: ignore[no-any-return]

    def commit(self, output: EpochOutput, pending: Any) -> None:
        self.sink.commit(output, pending)

    def committed(self, pending: Any) -> Held | None:
        return self.sink.committed(pending)  # type: ignore[no-any-return]


def _rate(repo: Repository, job: Job, parallelism: int) -> float:
    spark = build_spark_session(master=f"local[{parallelism}]", app_name="bench-sinks")
    results = EpochRunner(spark, job, repo=repo, parallelism=parallelism).run()
    records = sum(r.records_in for r in results)
    return records / sum(r.duration_s for r in results)


def per_epoch_checksums(table: pa.Table) -> dict[int, Any]:
    out = {}
    for epoch in sorted(set(table.column(EPOCH).to_pylist())):
        rows = table.filter(pc.equal(table.column(EPOCH), epoch))
        out[int(epoch)] = checksum_arrow(rows.select(["key", "count", "sum_value", "max_value"]))
    return out


def measure_sink(
    *,
    kind: str,
    make_sink: Callable[[Path], Any],
    read_destination: Callable[[Any], pa.Table],
    records_per_epoch: int,
    epochs: int,
    workdir: Path,
    parallelism: int = 2,
    settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Baseline (no sink) then the same job with `make_sink(workdir)`'s sink; the figures."""
    workdir.mkdir(parents=True, exist_ok=True)
    # a warm-up epoch (JIT, Python workers) outside both timed runs
    _rate(Repository.open(f"file://{workdir}/warmup", "bench"), bench_job(20_000, 1), parallelism)
    without = _rate(
        Repository.open(f"file://{workdir}/without", "bench"),
        bench_job(records_per_epoch, epochs),
        parallelism,
    )
    timed = Timed(make_sink(workdir))
    repo = Repository.open(f"file://{workdir}/with", "bench")
    with_sink = _rate(repo, bench_job(records_per_epoch, epochs, [timed]), parallelism)
    stored = per_epoch_checksums(read_output(repo, "main"))
    written = per_epoch_checksums(read_destination(timed.sink))
    ordered = sorted(timed.write_ms)
    return {
        "kind": kind,
        "records_per_epoch": records_per_epoch,
        "epochs": epochs,
        "parallelism": parallelism,
        "records_per_s_with_sink": round(with_sink, 1),
        "records_per_s_without_sink": round(without, 1),
        "ratio_with_sink": round(with_sink / without, 3),
        "sink_commit_p50_ms": round(statistics.median(ordered), 1) if ordered else None,
        "sink_commit_p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1)
        if ordered
        else None,
        "sink_epochs_written": len(ordered),
        "output_rows": int(sum(c.rows for c in stored.values())),
        "exactly_once_checked": bool(stored) and stored == written,
        "target": {"ratio_with_sink": TARGET_RATIO},
        **({"settings": settings} if settings else {}),
    }
