"""The ``large_state`` part of ``python -m bench.engine``: the vectorised job over a large key
space at the largest key-group count, against the same fair peers as the vectorised part.

Data (`bench.datagen`, incremental mode): epoch 1 writes every one of ``--large-keys`` keys
once (default 10,000,000: the state the job then holds), each later epoch one record to each
of ``--large-records`` distinct random keys (default 1,000,000), ``--large-epochs`` epochs in
all (default 3). The engine runs at p = 2 with M = ``--large-max-parallelism`` (default
32,768, the limit) and commits every epoch; the peers are Spark's built-in streaming
aggregation (default state store) and the stateless per-file aggregation, run exactly as in
the vectorised part (`bench/spark_peers.py`, the shared session: JVM defaults, 4g driver).
Every variant's checksums are checked against the numpy reference.

Reported as one ``large_state`` object: records/s of each variant and the ratios, the engine's
commit p50/p99, the peak RSS of the process tree while each variant ran, seconds per epoch,
and the state's size at the last snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench import checksum as ck
from bench.timing import PeakRss, TreeCpu, VariantResult, log, percentile

VARIANTS = ("spark_builtin", "stateless", "engine")


@dataclass(frozen=True)
class LargeStateSizes:
    keys: int
    records: int  # records (distinct keys) of each epoch after the first
    epochs: int
    max_parallelism: int


DEFAULT_SIZES = LargeStateSizes(keys=10_000_000, records=1_000_000, epochs=3, max_parallelism=32768)
QUICK_SIZES = LargeStateSizes(keys=20_000, records=2_000, epochs=3, max_parallelism=4096)


def measure(bench: Any, sizes: LargeStateSizes) -> dict[str, Any]:
    """Run the part with `bench` (a `bench.engine.Bench`: its session, store, variant runner
    and checksum checks); returns ``{"large_state": {...}}``."""
    data = bench.dataset(
        "large_state",
        keys=sizes.keys,
        records=sizes.records,
        epochs=sizes.epochs,
        incremental=True,
        seed=13,
    )
    running = ck.reference_running(data)
    per_epoch = ck.reference_per_epoch(data)
    results: dict[str, VariantResult] = {}
    peaks: dict[str, float] = {}
    for variant in VARIANTS:
        if variant not in bench.variants:
            continue
        kw: dict[str, Any] = {}
        if variant == "engine":
            kw = {"name": "engine_large_state", "max_parallelism": sizes.max_parallelism}
        with TreeCpu() as cpu, PeakRss() as peak:
            result = bench.run_variant(variant, data, f"large-{variant}", **kw)
        result.cpu_s = cpu.seconds
        results[variant], peaks[variant] = result, round(peak.peak_mb, 1)
        log(f"large_state {result.summary()} peak RSS {peak.peak_mb:.0f} MB")
        if variant == "stateless":
            bench.check(result, per_epoch, "per-epoch reference (large state)")
        else:
            bench.check(result, running, "reference (large state)")

    def rps(variant: str) -> float | None:
        return round(results[variant].rps, 1) if variant in results else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    engine = results.get("engine")
    commits = engine.extra["commit_ms"] if engine else []
    figures: dict[str, Any] = {
        "keys": sizes.keys,
        "records_per_epoch_after_first": sizes.records,
        "epochs": sizes.epochs,
        "total_records": data.total_records,
        "max_parallelism": sizes.max_parallelism,
        "parallelism": 2,
        "engine_rps": rps("engine"),
        "spark_builtin_rps": rps("spark_builtin"),
        "stateless_rps": rps("stateless"),
        "ratio_vs_spark_builtin": ratio(rps("engine"), rps("spark_builtin")),
        "ratio_vs_stateless": ratio(rps("engine"), rps("stateless")),
        "commit_p50_ms": round(percentile(commits, 50), 1) if commits else None,
        "commit_p99_ms": round(percentile(commits, 99), 1) if commits else None,
        "commit_ms": [round(float(x), 1) for x in commits],
        "peak_rss_mb": peaks,
        "seconds_per_epoch": {
            v: [round(x, 3) for x in r.epoch_seconds] for v, r in results.items()
        },
        "cpu_seconds": {v: round(r.cpu_s, 2) for v, r in results.items()},
    }
    if engine is not None:
        figures["state_bytes_written"] = engine.extra.get("bytes_written")
    return {"large_state": figures}
