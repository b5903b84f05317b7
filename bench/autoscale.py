"""Autoscaling benchmark: ``python -m bench.autoscale [--runs N] [--quick] [--plot PATH]``.

A job is driven through a load ramp on local Spark — low, then 4x, then low again — with the
default autoscaling policy deciding its parallelism after every commit, ``--runs`` times
(default 3), and compared with a sweep of runs at fixed parallelisms:

* **input**: one Parquet file arrives every `tick` seconds (``low`` records per file, then
  ``4 * low``, then ``low``); the job reads one file per epoch (``max_files_per_epoch=1``),
  so a job slower than the input builds a backlog of files.
* **the job**: a keyed running sum per key whose per-record cost is a wait (each record's
  ``cost_ms`` column, like a lookup in an external service), so its tasks overlap on any
  number of cores and more parallelism really is faster — a CPU-bound job on this 2-core
  machine could not gain beyond 2 tasks, whatever the policy said.
* **autoscaled runs**: after every commit the default `Policy` (mode apply) decides from the
  branch's commits exactly as the control plane's `epochal.autoscale` task does
  (`controlplane.autoscaler.history.branch_samples` + `decision.decide`); a scale decision
  is applied the way a live `rescale` operation applies it: the new parallelism goes into
  the branch's control document and the engine switches at the next epoch boundary. A run
  that commits nothing for `stall_s` after its last file arrived stops; the files it never
  committed are counted in ``epochs_lost``.
* **reference**: every run's per-epoch output is checked against a pandas computation from
  the input files (epoch k reads the k-th file; per key the records and the running sum),
  independent of Spark and of the engine.
* **sweep**: the high load alone at fixed parallelisms, each measured ``sweep_repeats`` times
  (interleaved, so a change of the machine's load hits every parallelism alike); its spread
  is reported and ``sweep_best_parallelism`` is the smallest parallelism that keeps up in its
  worst repetition (backlog at most one file in the second half and utilisation at or below
  the policy's target).

Reported (last stdout line, one JSON object), per run and in total: ``reaction_epochs``
(epochs from the first high-load epoch to the first epoch at a higher parallelism; target:
median <= 3), ``flaps`` (parallelism changes among the high-load epochs after that first
change; target 0 in every run), ``epochs_lost`` (input files never committed, or committed
twice; target 0), ``checksums_match`` (against the reference), ``recommended_parallelism``
(where the high phase settled) against ``sweep_best_parallelism`` (target: within one step of
the sweep's parallelisms in every run), the load average at the start and end of every run
and of the whole benchmark. Exits 1 when any run misses a target (``--quick``: when any run
loses an epoch or mismatches its reference; its timing figures are only reported).
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import figures

REQUIRED_KEYS = (
    "reaction_epochs",
    "flaps",
    "epochs_lost",
    "checksums_match",
    "recommended_parallelism",
    "sweep_best_parallelism",
)


def log(message: str) -> None:
    print(f"[bench.autoscale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Setup:
    tick_s: float
    low: int
    low_ticks: int
    high_ticks: int
    tail_ticks: int
    cost_ms: float
    keys: int
    start_parallelism: int
    sweep: tuple[int, ...]
    sweep_ticks: int
    sweep_repeats: int

    @property
    def loads(self) -> list[int]:
        return (
            [self.low] * self.low_ticks
            + [4 * self.low] * self.high_ticks
            + [self.low] * self.tail_ticks
        )


FULL = Setup(
    tick_s=4.0,
    low=1000,
    low_ticks=8,
    high_ticks=20,
    tail_ticks=12,
    cost_ms=2.0,
    keys=200,
    start_parallelism=2,
    sweep=(2, 3, 4, 5, 6, 8),
    sweep_ticks=8,
    sweep_repeats=3,
)
QUICK = Setup(
    tick_s=3.0,
    low=300,
    low_ticks=4,
    high_ticks=8,
    tail_ticks=2,
    cost_ms=5.0,
    keys=100,
    start_parallelism=2,
    sweep=(2, 6),
    sweep_ticks=4,
    sweep_repeats=1,
)


def make_job(directory: str) -> Any:
    from runners.engine import Job, sources

    def total(key: Any, records: list[dict[str, Any]], state: Any, ctx: Any) -> Iterable[Any]:
        # the per-record wait (an external lookup), each record's own cost
        time.sleep(sum(float(r["cost_ms"]) for r in records) / 1000.0)
        running = state.value("total")
        value = (running.get() or 0) + sum(int(r["value"]) for r in records)
        running.set(value)
        yield {"key": key, "total": value, "n": len(records)}

    return Job(
        name="ramp",
        source=sources.ParquetDirectory(directory, max_files_per_epoch=1),
        key="key",
        process=total,
        time_mode="logical",
    )


def cost_factor(index: int, jitter: float, seed: int) -> float:
    """File `index`'s per-record cost multiplier: 1 +- `jitter`, uniform, from a generator
    seeded by (`seed`, `index`) (every record of a file costs the same: jitter drawn per
    record would average out over a file's records, this is the adversarial form)."""
    import numpy as np

    if not jitter:
        return 1.0
    return float(1.0 + jitter * np.random.default_rng([seed, 31, index]).uniform(-1.0, 1.0))


def write_file(
    directory: str,
    index: int,
    records: int,
    keys: int,
    cost_ms: float,
    *,
    jitter: float = 0.0,
    seed: int = 7,
) -> None:
    import numpy as np
    import pyarrow as pa

    from runners.engine.sources import write_parquet_file

    rng = np.random.default_rng([seed, index])
    cost = cost_ms * cost_factor(index, jitter, seed)
    table = pa.table(
        {
            "key": [f"k{int(k)}" for k in rng.integers(0, keys, records)],
            "value": pa.array(rng.integers(0, 100, records), type=pa.int64()),
            "cost_ms": pa.array([cost] * records, type=pa.float64()),
        }
    )
    write_parquet_file(directory, f"part-{index:05d}", table)


def feed(
    directory: str, loads: list[int], setup: Setup, done: threading.Event, jitter: float, seed: int
) -> None:
    """Write one file per tick, on the tick (a late tick is not made up by bunching)."""
    start = time.monotonic()
    for index, records in enumerate(loads):
        delay = start + index * setup.tick_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        write_file(directory, index, records, setup.keys, setup.cost_ms, jitter=jitter, seed=seed)
    done.set()


@dataclass
class EpochRow:
    epoch: int
    parallelism: int
    records_in: int
    busy_s: float
    backlog_epochs: int
    committed_s: float
    action: str = ""
    recommended: int = 0


@dataclass
class Run:
    """One run of the job: its committed epochs, its store, its input directory."""

    rows: list[EpochRow]
    repo: Any
    data: Path
    timed_out: bool


def run(
    spark: Any,
    root: Path,
    name: str,
    loads: list[int],
    setup: Setup,
    *,
    parallelism: int,
    policy: Any = None,
    realtime: bool = True,
    jitter: float = 0.0,
    seed: int = 7,
    stall_s: float | None = None,
    on_commit: Any = None,
    repo: Any = None,
) -> Run:
    """Run the job over `loads` (one file per tick when `realtime`, else all files first),
    deciding after every commit with `policy` (a `decision.Policy` in apply mode, or None: a
    fixed parallelism). Stops once every file is committed, or when nothing commits for
    `stall_s` seconds (default: 15 ticks, at least 60 s) after the last file was written;
    the files not committed then are the run's lost epochs. `on_commit(result)` is called
    after every commit (the tests evaluate recommend mode through it); `repo`: the store
    namespace to commit into (default: `name` in a store under `root`)."""
    from controlplane.autoscaler.decision import decide
    from controlplane.autoscaler.history import branch_samples, sample_limit
    from runners.engine import EpochRunner
    from snapshots_store import Repository

    stall = stall_s if stall_s is not None else max(60.0, 15 * setup.tick_s)
    data = root / f"{name}-input"
    data.mkdir(parents=True)
    repo = repo if repo is not None else Repository.open(f"file://{root / 'store'}", name)
    runner = EpochRunner(spark, make_job(str(data)), repo=repo, parallelism=parallelism)
    done = threading.Event()
    if realtime:
        feeder = threading.Thread(
            target=feed, args=(str(data), loads, setup, done, jitter, seed), daemon=True
        )
        feeder.start()
    else:
        for index, records in enumerate(loads):
            write_file(
                str(data), index, records, setup.keys, setup.cost_ms, jitter=jitter, seed=seed
            )
        done.set()
    rows: list[EpochRow] = []
    started = time.monotonic()
    progress = started
    timed_out = False
    while True:
        result = runner.run_epoch()
        if result is None:
            if done.is_set() and len(rows) >= len(loads):
                break
            if done.is_set() and time.monotonic() - progress > stall:
                timed_out = True
                log(
                    f"{name}: nothing committed for {stall:.0f} s after the last file: "
                    f"{len(rows)} of {len(loads)} files committed, the rest are lost"
                )
                break
            time.sleep(0.1)
            continue
        progress = time.monotonic()
        stats = repo.read_manifest(result.snapshot_id).stats
        row = EpochRow(
            epoch=result.epoch,
            parallelism=result.parallelism,
            records_in=result.records_in,
            busy_s=round(float(stats["busy_s"]), 3),
            backlog_epochs=int(stats.get("backlog_epochs", 0)),
            committed_s=round(progress - started, 3),
        )
        if policy is not None:
            samples, key_groups = branch_samples(
                repo, "main", sample_limit(policy), dwell_s=policy.min_dwell_s
            )
            decision = decide(policy, samples, key_groups=key_groups)
            row.action, row.recommended = decision.action, decision.recommended
            if decision.target is not None and policy.mode == "apply":
                # what a live rescale operation writes (controlplane/operations/kinds/rescale)
                doc, version = repo.read_control("main")
                repo.write_control("main", {**doc, "parallelism": decision.target}, version)
                log(
                    f"{name}: epoch {result.epoch}: {decision.action} -> {decision.target}: "
                    f"{decision.reason}"
                )
        if on_commit is not None:
            on_commit(result)
        rows.append(row)
        log(
            f"{name}: epoch {row.epoch} p={row.parallelism} records={row.records_in} "
            f"busy={row.busy_s}s backlog={row.backlog_epochs} at {row.committed_s}s"
        )
    return Run(rows=rows, repo=repo, data=data, timed_out=timed_out)


def _epoch_checksums(frame: Any) -> list[tuple[int, int, int]]:
    """Per epoch: (epoch, rows, crc32 of the sorted ``key|total|n`` lines)."""
    import zlib

    result = []
    for epoch, part in frame.groupby("epoch", sort=True):
        lines = sorted(
            f"{k}|{int(t)}|{int(n)}" for k, t, n in zip(part.key, part.total, part.n, strict=True)
        )
        result.append((int(epoch), len(lines), zlib.crc32("\n".join(lines).encode())))
    return result


def output_checksum(repo: Any) -> list[tuple[int, int, int]]:
    """The branch's per-epoch output checksums (what the engine committed)."""
    from runners.engine import read_output

    frame = read_output(repo, "main").to_pandas().rename(columns={"_epoch": "epoch"})
    return _epoch_checksums(frame[["epoch", "key", "total", "n"]])


def reference_checksum(data: Path) -> list[tuple[int, int, int]]:
    """The same checksums computed with pandas from the input files alone: epoch k reads the
    k-th file in name order; per key it outputs the records it read and the running sum."""
    import pandas as pd
    import pyarrow.parquet as pq

    files = sorted(data.glob("*.parquet"))
    if not files:
        return []
    frames = []
    for epoch, path in enumerate(files, start=1):
        frame = pq.read_table(path, columns=["key", "value"]).to_pandas()
        frame["epoch"] = epoch
        frames.append(frame)
    records = pd.concat(frames, ignore_index=True)
    per = records.groupby(["key", "epoch"], sort=True)["value"].agg(["size", "sum"]).reset_index()
    per["total"] = per.groupby("key")["sum"].cumsum()
    per = per.rename(columns={"size": "n"})
    return _epoch_checksums(per[["epoch", "key", "total", "n"]])


def compare_checksums(
    got: list[tuple[int, int, int]], expected: list[tuple[int, int, int]]
) -> list[str]:
    """The epochs where the engine's output differs from the reference (empty: equal)."""
    problems = []
    ours, theirs = dict((e, c) for e, *c in got), dict((e, c) for e, *c in expected)
    for epoch in sorted(set(ours) | set(theirs)):
        if ours.get(epoch) != theirs.get(epoch):
            problems.append(
                f"epoch {epoch}: engine (rows, crc) {ours.get(epoch)} != reference "
                f"{theirs.get(epoch)}"
            )
    return problems


def analyse(rows: list[EpochRow], loads: list[int], start_p: int) -> dict[str, Any]:
    high = 4 * min(loads)
    step = next((r.epoch for r in rows if r.records_in == high), None)
    # the parallelism the load step met (the policy may have moved off start_p before it)
    at_step = next((r.parallelism for r in rows if r.epoch == step), start_p)
    ups = [r for r in rows if step is not None and r.epoch >= step and r.parallelism > at_step]
    first_up = ups[0].epoch if ups else None
    reaction = None if step is None or first_up is None else first_up - step
    flat = [r for r in rows if r.records_in == high and first_up and r.epoch >= first_up]
    flaps = sum(1 for a, b in itertools.pairwise(flat) if a.parallelism != b.parallelism)
    settled = flat[-1].parallelism if flat else None
    read = [r.records_in for r in rows]
    lost = abs(len(loads) - len(rows)) + sum(1 for a, b in zip(read, loads, strict=False) if a != b)
    return {
        "step_epoch": step,
        "parallelism_at_step": at_step,
        "first_scale_up_epoch": first_up,
        "reaction_epochs": reaction,
        "flaps": flaps,
        "epochs_lost": lost,
        "recommended_parallelism": settled,
        "parallelism_changes": sum(
            1 for a, b in itertools.pairwise(rows) if a.parallelism != b.parallelism
        ),
        "final_parallelism": rows[-1].parallelism if rows else None,
    }


def steps_from(value: int, best: int, points: tuple[int, ...]) -> float:
    """How many of the sweep's parallelisms `value` lies from `best` (0.5 between two)."""
    ordered = sorted(points)

    def position(v: int) -> float:
        if v in ordered:
            return float(ordered.index(v))
        return bisect.bisect_left(ordered, v) - 0.5

    return position(value) - position(best)


def sweep(
    spark: Any, root: Path, setup: Setup, target: float, repeats: int
) -> tuple[int | None, list[dict[str, Any]]]:
    """Each parallelism of the sweep `repeats` times over the high load alone, interleaved
    (every round visits every parallelism, in alternating order)."""
    measured: dict[int, list[dict[str, Any]]] = {p: [] for p in setup.sweep}
    loads = [4 * setup.low] * setup.sweep_ticks
    for rep in range(repeats):
        order = setup.sweep if rep % 2 == 0 else tuple(reversed(setup.sweep))
        for p in order:
            done = run(spark, root, f"sweep-p{p}-r{rep + 1}", loads, setup, parallelism=p)
            rows = done.rows
            wall = rows[-1].committed_s - rows[0].committed_s if len(rows) > 1 else 0.0
            busy = sum(r.busy_s for r in rows[1:])
            utilisation = busy / (p * wall) if wall > 0 else None
            second_half = rows[len(rows) // 2 :]
            one: dict[str, Any] = {
                "utilisation": None if utilisation is None else round(utilisation, 3),
                "max_backlog_second_half": max((r.backlog_epochs for r in second_half), default=0),
                "backlog_end": rows[-1].backlog_epochs if rows else None,
                "finished_s_after_last_file": round(
                    (rows[-1].committed_s if rows else 0.0) - (len(loads) - 1) * setup.tick_s, 2
                ),
                "epochs_lost": analyse(rows, loads, p)["epochs_lost"] if rows else len(loads),
            }
            one["keeps_up"] = (
                one["max_backlog_second_half"] <= 1
                and utilisation is not None
                and utilisation <= target
                and one["epochs_lost"] == 0
            )
            measured[p].append(one)
            log(f"sweep p={p} repetition {rep + 1}: {one}")
    results = []
    for p in setup.sweep:
        reps = measured[p]
        utils = [r["utilisation"] for r in reps if r["utilisation"] is not None]
        results.append(
            {
                "parallelism": p,
                "utilisation_median": round(statistics.median(utils), 3) if utils else None,
                "utilisation_min": min(utils, default=None),
                "utilisation_max": max(utils, default=None),
                "max_backlog_second_half": max(r["max_backlog_second_half"] for r in reps),
                "keeps_up_runs": sum(r["keeps_up"] for r in reps),
                # the worst repetition keeps up: the lower bound of its capacity suffices
                "keeps_up": all(r["keeps_up"] for r in reps),
                "repetitions": reps,
            }
        )
    keeping_up = [r["parallelism"] for r in results if r["keeps_up"]]
    return (min(keeping_up) if keeping_up else None), results


def plot(rows: list[EpochRow], setup: Setup, path: str) -> None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    x = [r.committed_s for r in rows]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[r.records_in / setup.tick_s for r in rows],
            name="records read per tick-second",
            mode="lines+markers",
        ),
        secondary_y=False,
    )
    fig.add_trace(
        go.Scatter(x=x, y=[r.parallelism for r in rows], name="parallelism", line_shape="hv"),
        secondary_y=True,
    )
    fig.add_trace(
        go.Scatter(
            x=x, y=[r.backlog_epochs for r in rows], name="backlog (files)", line={"dash": "dot"}
        ),
        secondary_y=True,
    )
    fig.update_layout(
        title="One load ramp (low, 4x, low) under the default autoscaling policy",
        xaxis_title="seconds since the run started (one point per committed epoch)",
        template="plotly_white",
    )
    fig.update_yaxes(title_text="records/s", secondary_y=False)
    fig.update_yaxes(title_text="parallelism, backlog", secondary_y=True)
    figures.save(fig, Path(path))  # the PNG and the figure's data beside it (.json)


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def ramp_run(
    spark: Any, root: Path, index: int, setup: Setup, policy: Any, best: int | None
) -> dict[str, Any]:
    """One autoscaled ramp, checked against its reference; the figures and what missed."""
    loads = setup.loads
    load_start, began = _load(), time.monotonic()
    log(
        f"ramp {index}: {len(loads)} files, one per {setup.tick_s}s: {setup.low} -> {4 * setup.low}"
    )
    done = run(
        spark,
        root,
        f"ramp-{index}",
        loads,
        setup,
        parallelism=setup.start_parallelism,
        policy=policy,
    )
    mismatches = compare_checksums(output_checksum(done.repo), reference_checksum(done.data))
    report: dict[str, Any] = {
        "run": index,
        **analyse(done.rows, loads, setup.start_parallelism),
        "checksums_match": not mismatches,
        "checksum_mismatches": mismatches[:10],
        "timed_out": done.timed_out,
        "recommended_vs_best": None,
        "recommended_steps_from_best": None,
        "loadavg_start": load_start,
        "loadavg_end": _load(),
        "wall_s": round(time.monotonic() - began, 1),
        "series": [asdict(r) for r in done.rows],
    }
    rec = report["recommended_parallelism"]
    if best is not None and rec is not None:
        report["recommended_vs_best"] = round(rec / best, 3)
        report["recommended_steps_from_best"] = steps_from(rec, best, setup.sweep)
    return report


def failed_run(index: int, setup: Setup, exc: BaseException) -> dict[str, Any]:
    """The report of a ramp that raised: every file counts as lost, nothing matched."""
    return {
        "run": index,
        "error": repr(exc)[:2000],
        "reaction_epochs": None,
        "flaps": 0,
        "epochs_lost": len(setup.loads),
        "checksums_match": False,
        "checksum_mismatches": [],
        "timed_out": False,
        "recommended_parallelism": None,
        "recommended_vs_best": None,
        "recommended_steps_from_best": None,
        "loadavg_start": None,
        "loadavg_end": _load(),
        "wall_s": None,
        "series": [],
    }


def judge(report: dict[str, Any], *, targets: bool) -> list[str]:
    """What one run missed: correctness always; the autoscaling targets when `targets`."""
    missed = [f"failed: {report['error']}"] if report.get("error") else []
    if report["epochs_lost"]:
        missed.append(f"{report['epochs_lost']} epochs lost")
    if not report["checksums_match"]:
        missed.append("output differs from the reference")
    if targets:
        if report["flaps"]:
            missed.append(f"{report['flaps']} flaps")
        if report["reaction_epochs"] is None:
            missed.append("never scaled up after the load step")
        steps = report["recommended_steps_from_best"]
        if steps is None:
            missed.append("no sweep best or no recommendation to compare")
        elif abs(steps) > 1:
            missed.append(
                f"recommended {report['recommended_parallelism']} is {steps:+g} steps from "
                "the sweep's best"
            )
    return missed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.autoscale", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a short ramp and a 2-point sweep")
    parser.add_argument("--runs", type=int, help="ramps to run (default 3; --quick: 1)")
    parser.add_argument(
        "--plot", help="write the first ramp's figure: PATH (.png) and its data (.json) beside"
    )
    parser.add_argument("--no-sweep", action="store_true", help="skip the fixed-p sweep")
    args = parser.parse_args(argv)
    if args.plot and not args.plot.endswith(".png"):
        parser.error(f"--plot {args.plot}: give a .png path (its data goes beside, .json)")
    setup = QUICK if args.quick else FULL
    runs = args.runs if args.runs is not None else (1 if args.quick else 3)
    if runs < 1:
        parser.error("--runs must be at least 1")

    from controlplane.autoscaler.decision import Policy
    from runners.engine.session import build_spark_session

    policy = Policy(mode="apply")
    load_start = _load()
    began = time.monotonic()
    cores = max(setup.sweep)
    spark = build_spark_session(master=f"local[{cores}]", app_name="bench-autoscale")
    root = Path(tempfile.mkdtemp(prefix="bench-autoscale-"))
    reports: list[dict[str, Any]] = []
    try:
        log("warm-up: Spark and its Python workers at the largest parallelism (not measured)")
        run(
            spark,
            root,
            "warmup",
            [setup.low] * 2,
            setup,
            parallelism=cores,
            realtime=False,
        )
        best, sweep_rows = (
            (None, [])
            if args.no_sweep
            else sweep(spark, root, setup, policy.target_utilisation, setup.sweep_repeats)
        )
        load_after_sweep = _load()
        log(f"sweep best: {best}")
        for index in range(1, runs + 1):
            try:
                reports.append(ramp_run(spark, root, index, setup, policy, best))
            except Exception as exc:  # the run failed: report it, go on with the next
                log(f"ramp {index} failed: {exc!r}")
                reports.append(failed_run(index, setup, exc))
            if index == 1 and args.plot and reports[0]["series"]:
                plot([EpochRow(**r) for r in reports[0]["series"]], setup, args.plot)
                log(f"plot written to {args.plot}")
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    targets = not args.quick
    for report in reports:
        report["missed"] = judge(report, targets=targets)
    reactions = [r["reaction_epochs"] for r in reports]
    median_reaction = None if any(x is None for x in reactions) else statistics.median(reactions)
    missed = [f"run {r['run']}: {m}" for r in reports for m in r["missed"]]
    if targets and (median_reaction is None or median_reaction > 3):
        missed.append(f"median reaction {median_reaction} epochs (target <= 3)")
    recommended = [r["recommended_parallelism"] for r in reports]
    ratios = [r["recommended_vs_best"] for r in reports]
    summary: dict[str, Any] = {
        "runs": len(reports),
        "reaction_epochs": median_reaction,
        "reaction_epochs_per_run": reactions,
        "flaps": sum(r["flaps"] for r in reports),
        "flaps_per_run": [r["flaps"] for r in reports],
        "epochs_lost": sum(r["epochs_lost"] for r in reports),
        "epochs_lost_per_run": [r["epochs_lost"] for r in reports],
        "checksums_match": all(r["checksums_match"] for r in reports),
        "checksums_match_per_run": [r["checksums_match"] for r in reports],
        "recommended_parallelism": (
            None if None in recommended else statistics.median(recommended)
        ),
        "recommended_parallelism_per_run": recommended,
        "sweep_best_parallelism": best,
        "recommended_vs_best": None if None in ratios else statistics.median(ratios),
        "recommended_vs_best_per_run": ratios,
        "recommended_steps_from_best_per_run": [r["recommended_steps_from_best"] for r in reports],
        "targets": {
            "flaps": "0 in every run",
            "reaction_epochs": "median <= 3",
            "recommended_parallelism": "within one step of the sweep's best in every run",
            "epochs_lost": "0",
            "checksums_match": "true in every run (pandas reference from the input files)",
            "judged": "correctness only (--quick)" if args.quick else "all",
        },
        "missed": missed,
        "verdict": "met" if not missed else "missed",
        "loadavg_per_run": [
            {"run": r["run"], "start": r["loadavg_start"], "end": r["loadavg_end"]} for r in reports
        ],
        "loadavg_start": load_start,
        "loadavg_after_sweep": load_after_sweep,
        "loadavg_end": _load(),
        "sweep": sweep_rows,
        "per_run": reports,
        "epochs": len(reports[0]["series"]) if reports else 0,
        "series": reports[0]["series"] if reports else [],
        "setup": asdict(setup),
        "policy": asdict(policy),
        "spark_master": f"local[{cores}]",
        "cpus": os.cpu_count(),
        "wall_s": round(time.monotonic() - began, 1),
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "quick": args.quick,
    }
    for line in missed:
        log(f"MISSED {line}")
    print(json.dumps(summary))
    return 0 if not missed else 1


if __name__ == "__main__":
    raise SystemExit(main())
