"""Engine benchmark: ``python -m bench.engine [--quick] [--parts vectorised,python,incremental]``.

One SparkSession (``local[2]``, `runners.engine.session.build_spark_session`) and the same
generated Parquet epochs (bench/datagen.py: one file per epoch, uniform keys, fixed seed) for
every variant of one keyed running aggregate: count, sum and max of ``value`` per ``key``, state
kept across epochs, one output row per changed key per epoch.

1. Vectorised path (default 1,000,000 keys, 6 epochs x 1,000,000 records): the engine's
   built-in aggregation committing every epoch (``engine_rps``); Spark's streaming
   ``groupBy().agg()`` in update mode on the default state store (``spark_builtin_rps``); a
   stateless ``spark.read.parquet(file).groupBy().agg()`` per epoch file (``stateless_rps``).
2. Per-key Python path (default 50,000 keys, 3 epochs x 50,000 records): the engine's per-key
   ``process`` function (``engine_python_rps``); ``transformWithStateInPandas`` on RocksDB
   (``spark_tws_rps``).
3. Incremental snapshots (1,000,000 keys; epoch 1 writes every key, then epochs touching 1% of
   the keys): ``bytes_written_per_epoch`` vs ``changed_state_bytes_per_epoch``.

Every variant is warmed once on a tiny set first; rates exclude JVM start. Per-epoch checksums
(bench/checksum.py) of every stateful variant must equal each other and a numpy reference
computed from the generator's arrays; the stateless variant's (per-epoch partials, not running
values) must equal a per-epoch numpy reference. Any mismatch: a loud message on stderr, the
JSON still printed with ``"checksums_match": false``, exit status 1.

Progress goes to stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import checksum as ck
from bench import engine_recovery
from bench.datagen import ROW_GROUP_ROWS, EpochSet
from bench.driver_model import driver_point, fit_driver_model
from bench.engine_job import aggregate_job
from bench.timing import (
    PeakRss,
    TreeCpu,
    VariantResult,
    code_version,
    log,
    percentile,
    tree_rss_mb,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPO_ROOT = Path(__file__).resolve().parent.parent
PARTS = (
    "vectorised",
    "python",
    "incremental",
    "scale",
    "driver",
    "live_rescale",
    "recovery",
    "limit",
    "restore",
    "large_state",
    "spark_ui",
)
DRIVER_MEMORY = "4g"  # every variant's driver, the engine's and the peers' (one session)
PARALLELISM = 2
MAX_PARALLELISM = 128
SCALE_ROUNDS = 2  # local[1] and local[2] alternate this many times in the scale part; best of each

REQUIRED_KEYS = (
    "records",
    "keys",
    "epochs",
    "engine_rps",
    "spark_builtin_rps",
    "stateless_rps",
    "ratio_vs_spark_builtin",
    "ratio_vs_stateless",
    "engine_python_rps",
    "spark_tws_rps",
    "ratio_python_vs_spark_tws",
    "bytes_written_per_epoch",
    "changed_state_bytes_per_epoch",
    "commit_p50_ms",
    "commit_p99_ms",
    "peak_rss_mb",
    "spark_tws_row_rps",
    "peers_jvm_options",
    "driver_memory",
    "scale_1_to_2",
    "limit_rps",
    "ratio_vs_limit",
    "live_rescale_epochs_lost",
    "live_rescale_gap_ratio",
    "recovery_s",
    "recovery_ratio",
    "driver_model",
    "restore_mb_s",
    "disk_read_mb_s",
    "restore_ratio",
    "large_state",
)


@dataclass(frozen=True)
class Sizes:
    keys: int
    records: int
    epochs: int
    python_keys: int
    python_records: int
    python_epochs: int
    incremental_keys: int
    incremental_fraction: float
    incremental_epochs: int
    warm_keys: int
    warm_records: int
    warm_epochs: int
    driver_keys: int
    driver_records: int
    driver_epochs: int
    live_keys: int
    live_records: int
    live_epochs: int
    #: the recovery part's epochs (of live_records over live_keys): the first run's epochs
    #: before the pause, 3 steady ones, the one killed, the restarted run's
    recovery_epochs: int


DEFAULT_SIZES = Sizes(  # the whole run fits in 20 minutes on 2 quiet cores (part_wall_s)
    keys=1_000_000,
    records=1_000_000,
    epochs=6,
    python_keys=50_000,
    python_records=50_000,
    python_epochs=3,
    incremental_keys=1_000_000,
    incremental_fraction=0.01,
    incremental_epochs=4,
    warm_keys=5_000,
    warm_records=5_000,
    warm_epochs=3,
    driver_keys=100_000,
    driver_records=100_000,
    driver_epochs=4,
    live_keys=200_000,
    live_records=200_000,
    live_epochs=12,
    recovery_epochs=12,
)
QUICK_SIZES = Sizes(
    keys=2_000,
    records=2_000,
    epochs=3,
    python_keys=300,
    python_records=300,
    python_epochs=2,
    incremental_keys=20_000,
    incremental_fraction=0.01,
    incremental_epochs=3,
    warm_keys=200,
    warm_records=200,
    warm_epochs=1,
    driver_keys=500,
    driver_records=500,
    driver_epochs=2,
    live_keys=500,
    live_records=500,
    live_epochs=6,
    recovery_epochs=10,
)


# -- the engine variants ---------------------------------------------------------------------


def running_aggregate(key: Any, records: list[dict[str, Any]], state: Any, ctx: Any) -> Iterator:
    """The per-key Python job: count, sum and max of ``value``, kept in the key's value state."""
    agg_state = state.value("agg")
    previous = agg_state.get()
    if previous is None:
        count, total, maximum = 0, 0, None
    else:
        count, total, maximum = previous
    for record in records:
        value = record["value"]
        count += 1
        total += value
        if maximum is None or value > maximum:
            maximum = value
    agg_state.set((count, total, maximum))
    yield {"key": key, "count": count, "sum_value": total, "max_value": maximum}


def _engine_job(name: str, epochs: EpochSet, python: bool) -> Any:
    from runners.engine import Job, sources

    if not python:
        return aggregate_job(name, epochs.directory)
    source = sources.ParquetDirectory(str(epochs.directory), max_files_per_epoch=1)
    return Job(name=name, source=source, key="key", process=running_aggregate, code_version="1")


def _store_object_bytes(store_url: str, namespace: str) -> int | None:
    """Bytes under the namespace's objects/ folder (file:// stores only), else None."""
    if store_url.startswith("file://"):
        root = Path(store_url[len("file://") :])
    elif "://" not in store_url:
        root = Path(store_url)
    else:
        return None
    objects = root / namespace / "objects"
    if not objects.exists():
        return 0
    return sum(f.stat().st_size for f in objects.rglob("*") if f.is_file())


def run_engine(
    spark: SparkSession,
    epochs: EpochSet,
    store_url: str,
    namespace: str,
    *,
    python: bool,
    name: str,
    measure_store: bool = False,
    parallelism: int = PARALLELISM,
    max_parallelism: int = MAX_PARALLELISM,
    routing: str = "auto",
    before_epoch: Any = None,
) -> VariantResult:
    """Run the engine for `epochs.epochs` epochs, committing each; checksums from read_output
    after the timed epochs. `before_epoch(repo, epoch)`, if given, runs (untimed) before each
    epoch: the live-rescale part writes the branch's control document there."""
    from runners.engine import EpochRunner, read_output
    from snapshots_store import Repository

    repo = Repository.open(store_url, namespace)
    job = _engine_job(name, epochs, python)
    results: list[Any] = []
    store_deltas: list[int] = []
    before = _store_object_bytes(store_url, namespace) if measure_store else None
    t0 = time.perf_counter()
    runner = EpochRunner(
        spark,
        job,
        repo=repo,
        branch="main",
        parallelism=parallelism,
        max_parallelism=max_parallelism,
        routing=routing,
    )
    epoch_seconds: list[float] = []
    commit_times: list[float] = []
    setup_s = time.perf_counter() - t0
    for epoch in range(1, epochs.epochs + 1):
        if before_epoch is not None:
            before_epoch(repo, epoch)
        e0 = time.perf_counter()
        res = runner.run_epoch()
        commit_times.append(time.perf_counter())
        epoch_seconds.append(commit_times[-1] - e0)
        if res is None:
            raise RuntimeError(f"{name}: epoch {epoch} did not run ({runner.stopped_reason})")
        results.append(res)
        if measure_store:
            # Measured outside the epoch's timed span, never inside.
            now = _store_object_bytes(store_url, namespace)
            if now is not None and before is not None:
                store_deltas.append(now - before)
                before = now
    seconds = setup_s + sum(epoch_seconds)
    records = sum(int(r.records_in) for r in results)
    if records != epochs.total_records:
        raise RuntimeError(f"{name} read {records} records, expected {epochs.total_records}")
    checksums = engine_checksums(read_output(repo, "main"), epochs.epochs)
    extra: dict[str, Any] = {
        "setup_s": setup_s,
        "commit_ms": [float(r.commit_ms) for r in results],
        "duration_s": [float(r.duration_s) for r in results],
        "bytes_written": [int(r.bytes_written) for r in results],
        "changed_state_bytes": [int(r.changed_state_bytes) for r in results],
        "output_rows": [int(r.output_rows) for r in results],
        "dead_letters": [int(r.dead_letters) for r in results],
        "parallelism": [int(r.parallelism) for r in results],
        "commit_times": commit_times,
    }
    if store_deltas:
        extra["store_object_bytes"] = store_deltas
    extra.update(_manifest_detail(repo, [r.snapshot_id for r in results]))
    return VariantResult(name, records, seconds, epoch_seconds, checksums, extra)


def _manifest_detail(repo: Any, snapshot_ids: list[str]) -> dict[str, list[Any]]:
    """Per-epoch stage timings and byte counts from the committed manifests (read untimed).

    ``output_bytes``: payload bytes of the epoch's sink output objects, so that
    ``state_bytes_written = bytes_written - output_bytes`` is what the state chunks cost.
    """
    detail: dict[str, list[Any]] = {
        "map_s": [],
        "reduce_s": [],
        "process_s": [],
        "chunks_written": [],
        "cache_hits": [],
        "cache_misses": [],
        "output_bytes": [],
        "state_bytes_written": [],
        "routing": [],
        "tasks_wall_s": [],
    }
    for snapshot_id in snapshot_ids:
        manifest = repo.read_manifest(snapshot_id)
        stats = manifest.stats
        detail["routing"].append(manifest.extra.get("routing"))
        for key in (
            "map_s",
            "reduce_s",
            "process_s",
            "chunks_written",
            "cache_hits",
            "cache_misses",
            "tasks_wall_s",
        ):
            detail[key].append(stats.get(key))
        out = sum(len(repo.get_object(o)) for o in manifest.outputs)
        detail["output_bytes"].append(out)
        detail["state_bytes_written"].append(int(stats.get("bytes_written", 0)) - out)
    return detail


def engine_checksums(table: Any, epochs: int) -> list[ck.Checksum]:
    """Split the engine's output union by ``_epoch`` (1..epochs) and checksum each epoch."""
    import numpy as np
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return [ck.EMPTY] * epochs
    epoch_col = np.asarray(pc.cast(table.column("_epoch"), "int64").to_numpy())
    found = sorted(set(np.unique(epoch_col).tolist()))
    if found and (found[0] < 1 or found[-1] > epochs):
        raise RuntimeError(f"engine output has epochs {found}, expected 1..{epochs}")
    order = np.argsort(epoch_col, kind="stable")
    table = table.take(order)
    epoch_col = epoch_col[order]
    bounds = np.searchsorted(epoch_col, np.arange(1, epochs + 2))
    result = []
    for e in range(epochs):
        start, end = int(bounds[e]), int(bounds[e + 1])
        result.append(ck.checksum_arrow(table.slice(start, end - start)))
    return result


# -- orchestration ---------------------------------------------------------------------------


VARIANTS = ("spark_builtin", "stateless", "engine", "engine_python", "spark_tws", "spark_tws_row")
PART_VARIANTS = {
    "vectorised": ("spark_builtin", "stateless", "engine"),
    "python": ("engine_python", "spark_tws", "spark_tws_row"),
    "incremental": ("engine",),
    "scale": ("engine",),
    "driver": ("engine",),
    "live_rescale": ("engine",),
    "recovery": ("engine",),
    "limit": ("engine",),
    "restore": ("engine",),
    "large_state": ("spark_builtin", "stateless", "engine"),
    "spark_ui": ("engine",),
}


class Bench:
    def __init__(
        self,
        spark: SparkSession,
        work: Path,
        store_url: str,
        sizes: Sizes,
        variants: Iterable[str] = VARIANTS,
        routing: str = "auto",
        parallelism: int = PARALLELISM,
    ) -> None:
        self.variants = set(variants)
        self.routing = routing
        #: the engine variants' tasks p (the scale part's local[1] child runs at p = 1)
        self.parallelism = parallelism
        self.spark = spark
        self.work = work
        self.store_url = store_url
        self.sizes = sizes
        self.run_id = datetime.now(UTC).strftime("%Y%m%d%H%M%S") + f"-{os.getpid()}"
        self.problems: list[str] = []
        self.results: dict[str, VariantResult] = {}
        self.extra: dict[str, Any] = {}  # figures of the engine-only parts
        self.quick = False  # tiny sizes for the parts sized in their own modules
        self.size_overrides: dict[str, int | None] = {}  # their --restore-… / --large-… flags
        self.recovery_modes: tuple[str, ...] = engine_recovery.MODES
        self.datasets: dict[tuple[str, str], EpochSet] = {}

    def namespace(self, name: str) -> str:
        return f"bench-{name}-{self.run_id}".replace("_", "-")

    def dataset(self, name: str, **kwargs: Any) -> EpochSet:
        cached = self.datasets.get((name, repr(sorted(kwargs.items()))))
        if cached is not None:
            return cached
        t0 = time.perf_counter()
        epochs = EpochSet(self.work / "data" / name, **kwargs).generate()
        self.datasets[(name, repr(sorted(kwargs.items())))] = epochs
        log(
            f"data {name}: {epochs.epochs} files, {epochs.total_records:,} records "
            f"({time.perf_counter() - t0:.1f} s)"
        )
        return epochs

    def check(self, result: VariantResult, expected: list[ck.Checksum], what: str) -> None:
        problems = ck.compare(result.name, result.checksums, expected, what)
        if problems:
            self.problems.extend(problems)
            log(f"CHECKSUM MISMATCH: {result.name} vs {what}")
        else:
            log(f"checksums OK: {result.name} == {what} ({len(expected)} epochs)")

    def run_variant(self, variant: str, data: EpochSet, label: str, **kw: Any) -> VariantResult:
        """Run one variant over `data`; `label` names checkpoints and store namespaces."""
        from bench import spark_peers

        if variant == "spark_builtin":
            return spark_peers.run_spark_builtin(self.spark, data, self.work / f"cp-{label}")
        if variant == "stateless":
            return spark_peers.run_stateless(self.spark, data, self.work / f"out-{label}")
        if variant == "spark_tws":
            return spark_peers.run_spark_tws(self.spark, data, self.work / f"cp-{label}")
        if variant == "spark_tws_row":
            return spark_peers.run_spark_tws_row(self.spark, data, self.work / f"cp-{label}")
        python = variant == "engine_python"
        return run_engine(
            self.spark,
            data,
            self.store_url,
            self.namespace(label),
            python=python,
            name=kw.pop("name", variant),
            **{"routing": self.routing, "parallelism": self.parallelism, **kw},
        )

    def measure(
        self, variants: Iterable[str], data: EpochSet, label: str, *, warm: bool = False
    ) -> None:
        """Run `variants` (those selected) over `data` and check every checksum.

        Stateful variants must equal the numpy running reference and each other; the
        stateless variant (per-epoch partials) must equal the per-epoch reference.
        """
        t0 = time.perf_counter()
        running = ck.reference_running(data)
        per_epoch = ck.reference_per_epoch(data) if "stateless" in variants else []
        log(f"numpy reference checksums ({label}): {time.perf_counter() - t0:.1f} s")
        first: VariantResult | None = None
        for variant in variants:
            if variant not in self.variants:
                continue
            t1 = time.perf_counter()
            with TreeCpu() as cpu:
                result = self.run_variant(variant, data, f"{label}-{variant}")
            result.cpu_s = cpu.seconds
            if warm:
                log(f"warm {variant}: {time.perf_counter() - t1:.1f} s")
            else:
                self.results[result.name] = result
                log(result.summary())
            suffix = " (warm)" if warm else ""
            if variant == "stateless":
                self.check(result, per_epoch, f"per-epoch reference{suffix} (no running state)")
                continue
            self.check(result, running, f"reference{suffix}")
            if first is None:
                first = result
            else:
                self.check(result, first.checksums, first.name + suffix)

    # warm-up and the three parts ---------------------------------------------------------

    def warm(self, parts: Iterable[str]) -> None:
        s = self.sizes
        warm = self.dataset(
            "warm", keys=s.warm_keys, records=s.warm_records, epochs=s.warm_epochs, seed=99
        )
        wanted = {v for part in parts for v in PART_VARIANTS[part]}
        self.measure([v for v in VARIANTS if v in wanted], warm, "warm", warm=True)

    def vectorised(self) -> None:
        s = self.sizes
        data = self.dataset("vectorised", keys=s.keys, records=s.records, epochs=s.epochs)
        self.measure(PART_VARIANTS["vectorised"], data, "vec")

    def python(self) -> None:
        s = self.sizes
        data = self.dataset(
            "python", keys=s.python_keys, records=s.python_records, epochs=s.python_epochs
        )
        self.measure(PART_VARIANTS["python"], data, "py")

    def incremental(self) -> None:
        if "engine" not in self.variants:
            log("incremental: the engine variant is not selected, nothing to measure")
            return
        s = self.sizes
        touched = max(1, round(s.incremental_keys * s.incremental_fraction))
        data = self.dataset(
            "incremental",
            keys=s.incremental_keys,
            records=touched,
            epochs=s.incremental_epochs,
            incremental=True,
        )
        expected = ck.reference_running(data)
        with TreeCpu() as cpu:
            result = self.run_variant(
                "engine", data, "inc", name="engine_incremental", measure_store=True
            )
        result.cpu_s = cpu.seconds
        self.results[result.name] = result
        log(result.summary())
        self.check(result, expected, "reference")

    # the parts that measure the engine alone ------------------------------------------------

    def scale(self) -> None:
        """The vectorised engine work at local[1] with p = 1 and at local[2] with p = 2 (one
        child process each: a SparkContext's master is fixed), and at local[2] with the scan
        and shuffle routings.

        local[1] and local[2] run `SCALE_ROUNDS` times, alternating, and each keeps its best
        rate: a second task slot only pays when a second core is free, so one burst of other
        work on the machine during either child would otherwise decide the ratio. Every rate is
        in ``scale_runs``. A child that fails, or whose checksums do not match, fails the run
        (its reason in the problems)."""
        s = self.sizes
        runs = {"local1": ("local[1]", 1, "auto"), "local2": ("local[2]", 2, "auto")}
        plan = [label for _ in range(SCALE_ROUNDS) for label in runs]
        runs["local2_scan"] = ("local[2]", 2, "scan")
        runs["local2_shuffle"] = ("local[2]", 2, "shuffle")
        plan += ["local2_scan", "local2_shuffle"]
        measured: dict[str, list[float | None]] = {label: [] for label in runs}
        data = self.dataset("vectorised", keys=s.keys, records=s.records, epochs=s.epochs)
        for i, label in enumerate(plan):
            master, parallelism, routing = runs[label]
            work = self.work / f"scale-{label}-{i}"
            _link_files(data.directory, work / "data" / "vectorised")
            argv = [
                sys.executable, "-m", "bench.engine", "--parts", "vectorised",
                "--variants", "engine", "--master", master, "--parallelism", str(parallelism),
                "--routing", routing,
                "--keys", str(s.keys), "--records", str(s.records), "--epochs", str(s.epochs),
                "--warm-keys", str(s.warm_keys),
            ]  # fmt: skip
            child, failure = _child_report(argv, work)
            failure = scale_child_failure(child, failure, parallelism)
            rate = child.get("engine_rps") if child is not None and failure is None else None
            if failure is not None:
                self.problems.append(f"scale {label} ({master}, p={parallelism}): {failure}")
            measured[label].append(rate)
            log(f"scale {label} ({master}, p={parallelism}, routing {routing}): {rate} records/s")
        rates = {
            label: max((r for r in found if r is not None), default=None)
            for label, found in measured.items()
        }
        self.extra["scale_rps"] = rates
        self.extra["scale_runs"] = measured
        self.extra["scale_parallelism"] = {label: run[1] for label, run in runs.items()}
        self.extra["scale_1_to_2"] = _ratio(rates["local2"], rates["local1"])
        self.extra["scale_1_to_2_scan"] = _ratio(rates["local2_scan"], rates["local1"])
        self.extra["scale_1_to_2_shuffle"] = _ratio(rates["local2_shuffle"], rates["local1"])

    def driver(self) -> None:
        """The driver's time per epoch as key groups M and tasks p grow, and least-squares
        fits t = a + b*M + c*p with R² (bench/driver_model.py)."""
        cores = self.spark.sparkContext.defaultParallelism
        s = self.sizes
        data = self.dataset(
            "driver", keys=s.driver_keys, records=s.driver_records, epochs=s.driver_epochs
        )
        points = []
        grid = [(m, 2) for m in (128, 4096, 32768)] + [(4096, p) for p in (1, 4, 8)]
        for m, p in grid:
            result = self.run_variant(
                "engine", data, f"drv-m{m}-p{p}", name=f"engine_m{m}_p{p}",
                max_parallelism=m, parallelism=p,
            )  # fmt: skip
            x = result.extra
            point = driver_point(m, p, cores, x, _task_seconds(x), result.steady_epoch_s)
            points.append(point)
            log(f"driver M={m} p={p}: {point}")
        self.extra["driver_points"] = points
        self.extra["driver_model"] = fit_driver_model(points)

    def live_rescale(self) -> None:
        """Rescale 2 -> 3 -> 2 through the branch's control document while the job runs;
        epochs lost and the longest gap between commits around a rescale / the median gap."""
        s = self.sizes
        data = self.dataset(
            "live", keys=s.live_keys, records=s.live_records, epochs=s.live_epochs, seed=5
        )
        third = max(2, s.live_epochs // 3)
        plan = {third: 3, 2 * third: 2}

        def before(repo: Any, epoch: int) -> None:
            if epoch in plan:
                doc, version = repo.read_control("main")
                repo.write_control("main", {**doc, "parallelism": plan[epoch]}, version)

        result = self.run_variant("engine", data, "live", name="engine_live", before_epoch=before)
        self.check(result, ck.reference_running(data), "reference")
        times = result.extra["commit_times"]
        gaps = [b - a for a, b in itertools.pairwise(times)]  # gaps[i]: epoch i + 2's commit
        around = set(plan) | {e + 1 for e in plan}  # the rescaled epoch and the one after
        rescale_gaps = [g for i, g in enumerate(gaps) if i + 2 in around]
        others = [g for i, g in enumerate(gaps) if i + 2 not in around]
        parallelism = result.extra["parallelism"]
        self.extra["live_rescale_parallelism"] = parallelism
        self.extra["live_rescale_epochs_lost"] = s.live_epochs - len(parallelism)
        self.extra["live_rescale_gap_ratio"] = _ratio(max(rescale_gaps), statistics.median(others))
        self.extra["live_rescale_gaps_s"] = [round(g, 3) for g in gaps]
        if sorted(set(parallelism)) != [2, 3]:
            self.problems.append(f"live rescale ran at parallelism {parallelism}")

    def recovery(self) -> None:
        """Seconds from a driver SIGKILL mid-epoch to the first commit after the control
        plane restarted it — warm standby, cold, and cold after a lost node — each ÷ (the
        job's own cold start in that plane + 2 steady epochs); every mode's branch output
        against a failure-free run of the same job (bench/engine_recovery.py)."""
        s = self.sizes
        data = self.dataset(
            "recovery", keys=s.live_keys, records=s.live_records, epochs=s.recovery_epochs, seed=5
        )
        # the failure-free run: the same job in this session, checked against numpy
        reference = self.run_variant("engine", data, "recovery-ref", name="engine_recovery_ref")
        self.check(reference, ck.reference_running(data), "reference")
        figures = engine_recovery.measure_recovery(
            self.work, data, reference.checksums, modes=self.recovery_modes
        )
        self.problems.extend(figures.pop("recovery_problems"))
        self.extra.update(figures)

    def limit(self) -> None:
        """The machine's limit: the same keyed running aggregate over the vectorised epochs in
        one process with Polars, in memory, no Spark, no durability."""
        s = self.sizes
        data = self.dataset("vectorised", keys=s.keys, records=s.records, epochs=s.epochs)
        if "engine" not in self.results:  # the part alone: the engine over the same epochs
            self.measure(["engine"], data, "vec")
        with TreeCpu() as cpu:
            result = run_polars_limit(data)
        result.cpu_s = cpu.seconds
        self.results[result.name] = result
        log(result.summary())
        self.check(result, ck.reference_running(data), "reference")

    def restore(self) -> None:
        """A restart-rescale's restore rate vs the disk's bandwidth (bench/engine_restore.py)."""
        from bench import engine_restore as part

        sizes = part.QUICK_SIZES if self.quick else part.DEFAULT_SIZES
        sizes = _overridden(sizes, self.size_overrides, "restore_")
        figures = part.measure(
            self.spark, self.work, self.store_url, self.namespace("restore"), sizes
        )
        self.problems.extend(figures.pop("restore_problems", []))
        self.extra.update(figures)

    def large_state(self) -> None:
        """10M keys at M = 32,768 against the fair peers (bench/engine_large_state.py)."""
        from bench import engine_large_state as part

        sizes = part.QUICK_SIZES if self.quick else part.DEFAULT_SIZES
        self.extra.update(part.measure(self, _overridden(sizes, self.size_overrides, "large_")))

    def spark_ui(self) -> None:
        """An epoch with the Spark UI on vs off, in children (bench/engine_spark_ui.py)."""
        from bench import engine_spark_ui as part

        self.extra.update(part.measure(self, _link_files, _child_report))


def _overridden(sizes: Any, overrides: dict[str, int | None], prefix: str) -> Any:
    """A part's sizes dataclass with the given `--<prefix>field` flags applied."""
    import dataclasses

    changes = {
        f.name: overrides[prefix + f.name]
        for f in dataclasses.fields(sizes)
        if overrides.get(prefix + f.name) is not None
    }
    return dataclasses.replace(sizes, **changes)


def recovery_job(directory: str) -> Any:
    """The vectorised engine job over a directory of epoch files (the recovery part's job,
    launched by reference like any registered job)."""
    from runners.engine import Job, sources
    from runners.engine import aggregations as agg

    return Job(
        name="bench-recovery",
        source=sources.ParquetDirectory(directory, max_files_per_epoch=1),
        key="key",
        aggregate=[agg.count(), agg.sum("value"), agg.max("value")],
        code_version="1",
    )


def run_polars_limit(epochs: EpochSet) -> VariantResult:
    """Per epoch: read the file, group by key (count, sum, max), merge into the running state
    (a Polars frame), emit the changed keys' running values. Checksums after the timed span."""
    import polars as pl

    state: pl.DataFrame | None = None
    outputs = []
    epoch_seconds = []
    for path in epochs.files():
        e0 = time.perf_counter()
        batch = (
            pl.read_parquet(path, columns=["key", "value"])
            .group_by("key")
            .agg(
                pl.len().cast(pl.Int64).alias("count"),
                pl.col("value").sum().alias("sum_value"),
                pl.col("value").max().alias("max_value"),
            )
        )
        if state is None:
            out = batch
            state = batch
        else:
            out = batch.join(state, on="key", how="left", suffix="_old").select(
                "key",
                (pl.col("count") + pl.col("count_old").fill_null(0)).alias("count"),
                (pl.col("sum_value") + pl.col("sum_value_old").fill_null(0)).alias("sum_value"),
                pl.max_horizontal("max_value", "max_value_old").alias("max_value"),
            )
            state = state.update(out, on="key", how="full")
        outputs.append(out)
        epoch_seconds.append(time.perf_counter() - e0)
    checksums = [ck.checksum_arrow(out.to_arrow()) for out in outputs]
    return VariantResult(
        "polars_limit", epochs.total_records, sum(epoch_seconds), epoch_seconds, checksums
    )


def _link_files(source: Path, target: Path) -> None:
    """Hard-link (else copy) the epoch files of `source` into `target`: a child bench finds
    its data generated (the same sizes and seed make the same files) instead of writing it."""
    target.mkdir(parents=True, exist_ok=True)
    for path in source.glob("*.parquet"):
        if not (target / path.name).exists():
            try:
                os.link(path, target / path.name)
            except OSError:
                shutil.copy2(path, target / path.name)


def scale_child_failure(
    child: dict[str, Any] | None, failure: str | None, parallelism: int
) -> str | None:
    """Why a scale child's rate cannot count (None: it can): it failed, printed no report,
    its checksums did not match, or its engine epochs ran at another parallelism."""
    if failure is not None or child is None:
        return failure or "the child printed no report"
    if child.get("checksums_match") is not True:
        return f"checksums did not match: {child.get('checksum_problems')}"
    detail = (child.get("engine_epoch_detail") or {}).get("engine") or {}
    ran_at = sorted(set(detail.get("parallelism") or []))
    if ran_at != [parallelism]:
        return f"its engine epochs ran at parallelism {ran_at}, expected {parallelism}"
    return None


def _child_report(argv: list[str], work: Path) -> tuple[dict[str, Any] | None, str | None]:
    """Run a child `python -m bench.engine`: its JSON (None when it printed none) and why it
    failed (None when it exited 0 with a report)."""
    import subprocess

    proc = subprocess.run(
        [*argv, "--work-dir", str(work)], cwd=REPO_ROOT, capture_output=True, text=True
    )
    shutil.rmtree(work, ignore_errors=True)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    report: dict[str, Any] | None = None
    if lines:
        try:
            report = json.loads(lines[-1])
        except ValueError:
            report = None
    if proc.returncode == 0 and report is not None:
        return report, None
    tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
    log(f"child {' '.join(argv[2:])} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return report, f"the child exited {proc.returncode}: {tail[-600:]}"


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def build_report(bench: Bench, parts: list[str], peak: PeakRss, extra: dict[str, Any]) -> dict:
    r = bench.results
    s = bench.sizes

    def rps(name: str) -> float | None:
        return round(r[name].rps, 1) if name in r else None

    engine_commits = [
        ms
        for name in ("engine", "engine_python", "engine_incremental")
        if name in r
        for ms in r[name].extra["commit_ms"]
    ]
    inc = r.get("engine_incremental")
    inc_written = inc.extra["bytes_written"][1:] if inc else []
    inc_changed = inc.extra["changed_state_bytes"][1:] if inc else []
    inc_state = inc.extra["state_bytes_written"][1:] if inc else []
    state_written = _mean([float(x) for x in inc_state])
    bytes_written = _mean([float(x) for x in inc_written])
    changed = _mean([float(x) for x in inc_changed])
    report: dict[str, Any] = {
        "bench": "engine",
        "parts": parts,
        "variants": sorted(bench.variants),
        "records": s.records,
        "total_records": s.records * s.epochs,
        "keys": s.keys,
        "epochs": s.epochs,
        "records_per_epoch": s.records,
        "engine_rps": rps("engine"),
        "spark_builtin_rps": rps("spark_builtin"),
        "stateless_rps": rps("stateless"),
        "ratio_vs_spark_builtin": _ratio(rps("engine"), rps("spark_builtin")),
        "ratio_vs_stateless": _ratio(rps("engine"), rps("stateless")),
        "python_records": s.python_records * s.python_epochs,
        "python_keys": s.python_keys,
        "python_epochs": s.python_epochs,
        "engine_python_rps": rps("engine_python"),
        "spark_tws_rps": rps("spark_tws"),
        "ratio_python_vs_spark_tws": _ratio(rps("engine_python"), rps("spark_tws")),
        "spark_tws_row_rps": rps("spark_tws_row"),
        "ratio_python_vs_spark_tws_row": _ratio(rps("engine_python"), rps("spark_tws_row")),
        "limit_rps": rps("polars_limit"),
        "ratio_vs_limit": _ratio(rps("engine"), rps("polars_limit")),
        "engine_phase_breakdown": _phase_breakdown(r.get("engine"), r.get("polars_limit")),
        "incremental_keys": s.incremental_keys,
        "incremental_keys_touched_per_epoch": round(s.incremental_keys * s.incremental_fraction),
        "bytes_written_per_epoch": round(bytes_written) if bytes_written is not None else None,
        "changed_state_bytes_per_epoch": round(changed) if changed is not None else None,
        "ratio_bytes_written_vs_changed": _ratio(bytes_written, changed),
        "state_bytes_written_per_epoch": (
            round(state_written) if state_written is not None else None
        ),
        "ratio_state_bytes_written_vs_changed": _ratio(state_written, changed),
        "commit_p50_ms": round(percentile(engine_commits, 50), 1) if engine_commits else None,
        "commit_p99_ms": round(percentile(engine_commits, 99), 1) if engine_commits else None,
        "peak_rss_mb": round(peak.peak_mb, 1),
        "peak_rss_mb_by_phase": {k: round(v, 1) for k, v in peak.peaks.items()},
        "seconds_per_epoch": {
            name: [round(x, 3) for x in v.epoch_seconds] for name, v in r.items()
        },
        "steady_seconds_per_epoch": {name: round(v.steady_epoch_s, 3) for name, v in r.items()},
        "variant_seconds": {name: round(v.seconds, 3) for name, v in r.items()},
        # CPU seconds of the whole process tree (driver + JVM + Python workers) per variant,
        # and records per CPU second: far less sensitive to other load than wall-clock rates.
        "variant_cpu_seconds": {name: round(v.cpu_s, 2) for name, v in r.items()},
        "records_per_cpu_s": {
            name: round(v.records / v.cpu_s, 1) if v.cpu_s else None for name, v in r.items()
        },
        "checksums_match": not bench.problems,
        "checksum_problems": bench.problems[:20],
    }
    if inc:
        report["incremental_first_epoch_bytes_written"] = inc.extra["bytes_written"][0]
        if "store_object_bytes" in inc.extra:
            stored = inc.extra["store_object_bytes"]
            report["incremental_store_object_bytes_per_epoch"] = _mean(
                [float(x) for x in stored[1:]]
            )
            report["incremental_store_object_bytes_first_epoch"] = stored[0]
    report["engine_epoch_detail"] = {
        name: {k: v for k, v in r[name].extra.items()}
        for name in ("engine", "engine_python", "engine_incremental")
        if name in r
    }
    for key in (
        "scale_1_to_2",
        "live_rescale_epochs_lost",
        "live_rescale_gap_ratio",
        "recovery_s",
        "recovery_ratio",
        "restore_mb_s",
        "disk_read_mb_s",
        "restore_ratio",
        "large_state",
    ):
        report[key] = None  # a part not selected: its figures stay null
    report["driver_model"] = None
    report.update(bench.extra)
    report.update(extra)
    report["peers_jvm_options"] = {name: extra["jvm"] for name in r}
    return report


def _task_seconds(detail: dict[str, Any]) -> list[float]:
    """Per epoch, the task time on the critical path: with the scan routing (the manifest's
    `extra.routing`) the slowest task's `reduce_s` (which includes its `map_s`), with an
    exchange (split, shuffle) the slowest map + slowest reduce."""
    rows = zip(detail["map_s"], detail["reduce_s"], detail["routing"], strict=True)
    return [float(r or 0) + (0.0 if how == "scan" else float(m or 0)) for m, r, how in rows]


def _phase_breakdown(
    engine: VariantResult | None, limit: VariantResult | None
) -> dict[str, float] | None:
    """Where one steady engine epoch goes (median over epochs 2..n), beside the limit's epoch.

    tasks_s: the task time on the critical path (reading, hashing, Arrow transfer, aggregating,
    state chunks and output objects written); spark_and_driver_s: the rest of the time before the
    commit (planning, Spark job scheduling, task launch, shuffle, collecting reports);
    commit_s: manifest and ref CAS; other_s: the remainder of the epoch.
    """
    if engine is None:
        return None
    x = engine.extra

    def med(values: list[Any]) -> float:
        rest = [float(v or 0) for v in values[1:]] or [float(v or 0) for v in values]
        return statistics.median(rest)

    duration = med(x["duration_s"])
    tasks = med(_task_seconds(x))
    process = med(x["process_s"])
    commit = med(x["commit_ms"]) / 1000
    out = {
        "epoch_s": round(duration, 4),
        "tasks_s": round(tasks, 4),
        "spark_and_driver_s": round(max(process - tasks, 0.0), 4),
        "commit_s": round(commit, 4),
        "other_s": round(max(duration - process - commit, 0.0), 4),
    }
    if limit is not None:
        out["limit_epoch_s"] = round(limit.steady_epoch_s, 4)
    return out


def effective_jvm(spark: SparkSession) -> dict[str, Any]:
    """The driver JVM's actual input arguments and heap, as the JVM reports them."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    return {
        # -X options only: Spark's own --add-opens / module flags are the same for everyone
        "jvm_arguments": [str(a) for a in args if str(a).startswith("-X")],
        "max_heap_mb": round(jvm.java.lang.Runtime.getRuntime().maxMemory() / 2**20),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.engine", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes for a smoke run")
    p.add_argument("--keys", type=int)
    p.add_argument("--records", type=int, help="records per epoch (vectorised part)")
    p.add_argument("--epochs", type=int)
    p.add_argument("--python-keys", type=int)
    p.add_argument("--python-records", type=int, help="records per epoch (Python part)")
    p.add_argument("--python-epochs", type=int)
    p.add_argument("--incremental-keys", type=int)
    p.add_argument("--incremental-epochs", type=int)
    p.add_argument("--parts", default=",".join(PARTS), help="comma list of " + ", ".join(PARTS))
    for flag, what in PART_SIZE_FLAGS.items():
        p.add_argument(f"--{flag}", type=int, help=what)
    p.add_argument("--work-dir", help="data, checkpoints, default store (kept when given)")
    p.add_argument("--store-url", help="snapshot store URL (default: file://<work-dir>/store)")
    p.add_argument("--no-warm", action="store_true", help="skip the warm-up (debugging only)")
    p.add_argument("--progress-json", help="rewrite this file with the report after each part")
    p.add_argument("--warm-keys", type=int, help="keys and records of the warm-up epochs")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument(
        "--spark-ui",
        default="off",
        choices=("off", "on"),
        help="start the session's Spark UI (the spark_ui part's children; default off)",
    )
    p.add_argument(
        "--recovery-modes",
        default=",".join(engine_recovery.MODES),
        help="recovery part: which restarts to measure (warm standby, cold, node_lost)",
    )
    p.add_argument(
        "--parallelism", type=int, default=PARALLELISM, help="the engine variants' tasks p"
    )
    p.add_argument(
        "--routing", default="auto", choices=("auto", "scan", "shuffle"), help="engine routing"
    )
    p.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="comma list of variants to run (default all): " + ", ".join(VARIANTS),
    )
    args = p.parse_args(argv)
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        p.error(f"--parts: unknown {unknown}; choose from {', '.join(PARTS)}")
    args.parts = [x for x in PARTS if x in parts]
    variants = {x.strip() for x in args.variants.split(",") if x.strip()}
    if variants - set(VARIANTS) or not variants:
        p.error(f"--variants: unknown {sorted(variants - set(VARIANTS))}")
    args.variants = [x for x in VARIANTS if x in variants]
    modes = tuple(m.strip() for m in args.recovery_modes.split(",") if m.strip())
    if not modes or set(modes) - set(engine_recovery.MODES):
        p.error(f"--recovery-modes: choose from {', '.join(engine_recovery.MODES)}")
    args.recovery_modes = modes
    return args


PART_SIZE_FLAGS = {
    "restore-keys": "restore part: keys of the state restored (default 28,000,000)",
    "restore-touched": "restore part: distinct keys of the restored epoch (default 200,000)",
    "large-keys": "large_state part: keys (default 10,000,000)",
    "large-records": "large_state part: records of each epoch after the first (1,000,000)",
    "large-epochs": "large_state part: epochs (default 3)",
    "large-max-parallelism": "large_state part: key groups M (default 32,768)",
}


def sizes_from(args: argparse.Namespace) -> Sizes:
    base = QUICK_SIZES if args.quick else DEFAULT_SIZES
    overrides = {
        name: getattr(args, name)
        for name in (
            "keys",
            "records",
            "epochs",
            "python_keys",
            "python_records",
            "python_epochs",
            "incremental_keys",
            "incremental_epochs",
        )
        if getattr(args, name) is not None
    }
    if args.warm_keys is not None:
        overrides["warm_keys"] = overrides["warm_records"] = args.warm_keys
    for name, value in overrides.items():
        if value < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1")
    return Sizes(**{**base.__dict__, **overrides})


def prepare_environment() -> None:
    """Python workers must run this interpreter (pandas, pyarrow) and import bench/runners."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    path = os.environ.get("PYTHONPATH", "")
    if str(REPO_ROOT) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO_ROOT), path) if x)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = sizes_from(args)
    prepare_environment()
    keep = args.work_dir is not None
    work = Path(args.work_dir) if keep else Path(tempfile.mkdtemp(prefix="bench-engine-"))
    work.mkdir(parents=True, exist_ok=True)
    store_url = args.store_url or f"file://{(work / 'store').resolve()}"
    log(f"parts={args.parts} variants={args.variants} sizes={sizes} work={work} store={store_url}")
    started = time.perf_counter()
    load_start = os.getloadavg()
    try:
        with PeakRss() as peak:
            from runners.engine.session import build_spark_session

            peak.phase("session")
            t0 = time.perf_counter()
            spark = build_spark_session(
                master=args.master,
                app_name="bench-engine",
                conf={  # the JVM's defaults otherwise
                    "spark.driver.memory": DRIVER_MEMORY,
                    "spark.ui.enabled": "true" if args.spark_ui == "on" else "false",
                },
            )
            jvm = effective_jvm(spark)
            session_s = time.perf_counter() - t0
            log(
                f"SparkSession {spark.version} {spark.sparkContext.master} in {session_s:.1f} s "
                f"(excluded from every rate); tree RSS {tree_rss_mb():.0f} MB"
            )
            bench = Bench(
                spark,
                work,
                store_url,
                sizes,
                args.variants,
                routing=args.routing,
                parallelism=args.parallelism,
            )
            bench.quick = args.quick
            bench.recovery_modes = args.recovery_modes
            bench.size_overrides = {
                f.replace("-", "_"): getattr(args, f.replace("-", "_")) for f in PART_SIZE_FLAGS
            }
            # wall seconds of the session start, the warm-up and each part (data included)
            part_wall: dict[str, float] = {"session": round(session_s, 1)}
            if not args.no_warm:
                peak.phase("warm")
                w0 = time.perf_counter()
                bench.warm(args.parts)
                part_wall["warm"] = round(time.perf_counter() - w0, 1)
            loads: dict[str, list[float]] = {}

            def context() -> dict[str, Any]:
                return {
                    "spark_session_start_s": round(session_s, 2),
                    "master": args.master,
                    "driver_memory": DRIVER_MEMORY,
                    "jvm": jvm,
                    "wall_s": round(time.perf_counter() - started, 1),
                    "cpus": os.cpu_count(),
                    "loadavg_start": [round(x, 2) for x in load_start],
                    "loadavg_end": [round(x, 2) for x in os.getloadavg()],
                    "loadavg_by_part": loads,
                    "part_wall_s": part_wall,
                    "spark_version": spark.version,
                    "spark_ui": spark.sparkContext.uiWebUrl,
                    "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "quick": args.quick,
                    "row_group_rows": ROW_GROUP_ROWS,
                    **code_version(
                        REPO_ROOT,
                        "runners",
                        "bench",
                        "snapshots_store",
                        dirty_key="engine_tree_dirty",
                    ),
                }

            for part in args.parts:
                peak.phase(part)
                log(f"== part {part}")
                p0 = time.perf_counter()
                getattr(bench, part)()
                part_wall[part] = round(time.perf_counter() - p0, 1)
                loads[part] = [round(x, 2) for x in os.getloadavg()]
                if args.progress_json:  # the figures so far, should the run be cut short
                    partial = build_report(bench, args.parts, peak, context())
                    Path(args.progress_json).write_text(json.dumps(partial) + "\n")
        report = build_report(bench, args.parts, peak, context())
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    if bench.problems:
        bar = "!" * 78
        print(
            f"{bar}\nCHECK FAILED: a checksum mismatched or a part failed its checks\n"
            + "\n".join(bench.problems)
            + f"\n{bar}",
            file=sys.stderr,
            flush=True,
        )
    print(json.dumps(report, sort_keys=False), flush=True)
    return 1 if bench.problems else 0


if __name__ == "__main__":
    sys.exit(main())
