"""Autoscaling benchmark: ``python -m bench.autoscale [--quick] [--plot PATH]``.

A job is driven through a load ramp on local Spark — low, then 4x, then low again — with the
default autoscaling policy deciding its parallelism after every commit, and compared with runs
at fixed parallelisms:

* **input**: one Parquet file arrives every `tick` seconds (``low`` records per file, then
  ``4 * low``, then ``low``); the job reads one file per epoch (``max_files_per_epoch=1``),
  so a job slower than the input builds a backlog of files.
* **the job**: a keyed running sum per key whose per-record cost is a wait (``cost_ms`` per
  record, like a lookup in an external service), so its tasks overlap on any number of cores
  and more parallelism really is faster — a CPU-bound job on this 2-core machine could not
  gain beyond 2 tasks, whatever the policy said.
* **autoscaled run**: after every commit the default `Policy` (mode apply) decides from the
  branch's commits exactly as the control plane's `epochal.autoscale` task does
  (`controlplane.autoscaler.history.branch_samples` + `decision.decide`); a scale decision
  is applied the way a live `rescale` operation applies it: the new parallelism goes into
  the branch's control document and the engine switches at the next epoch boundary.
* **baseline**: the same input files read by a job at fixed parallelism 2 with no
  autoscaler (run after the files exist, as fast as it can): ``checksums_match`` compares its
  per-epoch output with the autoscaled run's.
* **sweep**: the high load alone at fixed parallelisms; ``sweep_best_parallelism`` is the
  smallest parallelism whose run keeps up (backlog at most one file at the end and mean
  utilisation at or below the policy's target).

Reported (last stdout line, one JSON object): ``reaction_epochs`` (epochs from the first
high-load epoch to the first epoch at a higher parallelism; the target is <= 5),
``flaps`` (parallelism changes among the high-load epochs after that first change; target
0), ``epochs_lost`` (input files never committed, or committed twice; target 0),
``checksums_match``, ``recommended_parallelism`` (where the autoscaler settled in the high
phase) against ``sweep_best_parallelism``, per-epoch series, and the load average.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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
)
QUICK = Setup(
    tick_s=3.0,
    low=300,
    low_ticks=4,
    high_ticks=8,
    tail_ticks=2,
    cost_ms=3.0,
    keys=100,
    start_parallelism=2,
    sweep=(2, 6),
    sweep_ticks=4,
)


def make_job(directory: str, cost_ms: float) -> Any:
    from runners.engine import Job, sources

    cost = cost_ms / 1000.0

    def total(key: Any, records: list[dict[str, Any]], state: Any, ctx: Any) -> Iterable[Any]:
        time.sleep(cost * len(records))  # the per-record wait (an external lookup)
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


def write_file(directory: str, index: int, records: int, keys: int) -> None:
    import numpy as np
    import pyarrow as pa

    from runners.engine.sources import write_parquet_file

    rng = np.random.default_rng([7, index])
    table = pa.table(
        {
            "key": [f"k{int(k)}" for k in rng.integers(0, keys, records)],
            "value": pa.array(rng.integers(0, 100, records), type=pa.int64()),
        }
    )
    write_parquet_file(directory, f"part-{index:05d}", table)


def feed(directory: str, loads: list[int], setup: Setup, done: threading.Event) -> None:
    """Write one file per tick, on the tick (a late tick is not made up by bunching)."""
    start = time.monotonic()
    for index, records in enumerate(loads):
        delay = start + index * setup.tick_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        write_file(directory, index, records, setup.keys)
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


def run(
    spark: Any,
    root: Path,
    name: str,
    loads: list[int],
    setup: Setup,
    *,
    parallelism: int,
    autoscale: bool,
    realtime: bool = True,
) -> tuple[list[EpochRow], Any]:
    """Run the job over `loads` (one file per tick when `realtime`, else all files first);
    returns one row per committed epoch and the repository."""
    from controlplane.autoscaler.decision import Policy, decide
    from controlplane.autoscaler.history import branch_samples, sample_limit
    from runners.engine import EpochRunner
    from snapshots_store import Repository

    data = root / f"{name}-input"
    data.mkdir(parents=True)
    repo = Repository.open(f"file://{root / 'store'}", name)
    runner = EpochRunner(
        spark, make_job(str(data), setup.cost_ms), repo=repo, parallelism=parallelism
    )
    policy = Policy(mode="apply")
    done = threading.Event()
    if realtime:
        feeder = threading.Thread(target=feed, args=(str(data), loads, setup, done), daemon=True)
        feeder.start()
    else:
        for index, records in enumerate(loads):
            write_file(str(data), index, records, setup.keys)
        done.set()
    rows: list[EpochRow] = []
    started = time.monotonic()
    while True:
        result = runner.run_epoch()
        if result is None:
            if done.is_set() and len(rows) >= len(loads):
                break
            time.sleep(0.1)
            continue
        stats = repo.read_manifest(result.snapshot_id).stats
        row = EpochRow(
            epoch=result.epoch,
            parallelism=result.parallelism,
            records_in=result.records_in,
            busy_s=round(float(stats["busy_s"]), 3),
            backlog_epochs=int(stats.get("backlog_epochs", 0)),
            committed_s=round(time.monotonic() - started, 3),
        )
        if autoscale:
            samples, key_groups = branch_samples(repo, "main", sample_limit(policy))
            decision = decide(policy, samples, key_groups=key_groups)
            row.action, row.recommended = decision.action, decision.recommended
            if decision.target is not None:
                # what a live rescale operation writes (controlplane/operations/kinds/rescale)
                doc, version = repo.read_control("main")
                repo.write_control("main", {**doc, "parallelism": decision.target}, version)
                log(
                    f"{name}: epoch {result.epoch}: {decision.action} -> {decision.target}: "
                    f"{decision.reason}"
                )
        rows.append(row)
        log(
            f"{name}: epoch {row.epoch} p={row.parallelism} records={row.records_in} "
            f"busy={row.busy_s}s backlog={row.backlog_epochs} at {row.committed_s}s"
        )
    return rows, repo


def output_checksum(repo: Any) -> list[tuple[int, int, int]]:
    """Per epoch: (epoch, rows, a hash of the sorted rows) of the branch's output."""
    import zlib

    from runners.engine import read_output

    table = read_output(repo, "main")
    by_epoch: dict[int, list[str]] = {}
    for row in table.to_pylist():
        by_epoch.setdefault(int(row["_epoch"]), []).append(
            f"{row['key']}|{row['total']}|{row['n']}"
        )
    return [
        (epoch, len(lines), zlib.crc32("\n".join(sorted(lines)).encode()))
        for epoch, lines in sorted(by_epoch.items())
    ]


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


def sweep(
    spark: Any, root: Path, setup: Setup, target: float
) -> tuple[int | None, list[dict[str, Any]]]:
    results = []
    for p in setup.sweep:
        loads = [4 * setup.low] * setup.sweep_ticks
        rows, _ = run(spark, root, f"sweep-p{p}", loads, setup, parallelism=p, autoscale=False)
        wall = rows[-1].committed_s - rows[0].committed_s if len(rows) > 1 else 0.0
        busy = sum(r.busy_s for r in rows[1:])
        utilisation = busy / (p * wall) if wall > 0 else math.inf
        measured = rows[len(rows) // 2 :]
        results.append(
            {
                "parallelism": p,
                "backlog_end": rows[-1].backlog_epochs,
                "max_backlog_second_half": max(r.backlog_epochs for r in measured),
                "utilisation": round(utilisation, 3),
                "finished_s_after_last_file": round(
                    rows[-1].committed_s - (len(loads) - 1) * setup.tick_s, 2
                ),
            }
        )
        log(f"sweep p={p}: {results[-1]}")
    keeping_up = [
        r["parallelism"]
        for r in results
        if r["max_backlog_second_half"] <= 1 and r["utilisation"] <= target
    ]
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
    if path.endswith(".html"):
        # plotly.js inlined (the copy in the pinned plotly package the dashboard serves too):
        # the page opens offline and asks no CDN.
        fig.write_html(path, include_plotlyjs=True, full_html=True)
    else:
        fig.write_image(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.autoscale", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a short ramp and a 2-point sweep")
    parser.add_argument("--plot", help="write the ramp's Plotly figure (.html, or .png/.svg)")
    parser.add_argument("--no-sweep", action="store_true", help="skip the fixed-p sweep")
    args = parser.parse_args(argv)
    setup = QUICK if args.quick else FULL

    from controlplane.autoscaler.decision import Policy
    from runners.engine.session import build_spark_session

    load_start = os.getloadavg()
    began = time.monotonic()
    cores = max(setup.sweep)
    spark = build_spark_session(master=f"local[{cores}]", app_name="bench-autoscale")
    root = Path(tempfile.mkdtemp(prefix="bench-autoscale-"))
    try:
        log("warm-up: Spark and its Python workers at the largest parallelism (not measured)")
        run(
            spark,
            root,
            "warmup",
            [setup.low] * 2,
            setup,
            parallelism=cores,
            autoscale=False,
            realtime=False,
        )
        loads = setup.loads
        log(f"ramp: {len(loads)} files, one per {setup.tick_s}s: {setup.low} -> {4 * setup.low}")
        rows, repo = run(
            spark, root, "ramp", loads, setup, parallelism=setup.start_parallelism, autoscale=True
        )
        load_after_ramp = os.getloadavg()
        log("baseline: the same files at fixed parallelism 2, no autoscaler")
        _, base_repo = run(
            spark,
            root,
            "baseline",
            loads,
            setup,
            parallelism=setup.start_parallelism,
            autoscale=False,
            realtime=False,
        )
        matches = output_checksum(repo) == output_checksum(base_repo)
        target = Policy().target_utilisation
        best, sweep_rows = (None, []) if args.no_sweep else sweep(spark, root, setup, target)
        if args.plot:
            plot(rows, setup, args.plot)
            log(f"plot written to {args.plot}")
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    report: dict[str, Any] = {
        **analyse(rows, loads, setup.start_parallelism),
        "checksums_match": matches,
        "sweep_best_parallelism": best,
        "sweep": sweep_rows,
        "target_reaction_le_5": None,
        "epochs": len(rows),
        "series": [asdict(r) for r in rows],
        "setup": asdict(setup),
        "policy": asdict(Policy(mode="apply")),
        "spark_master": f"local[{cores}]",
        "cpus": os.cpu_count(),
        "wall_s": round(time.monotonic() - began, 1),
        "loadavg_start": [round(x, 2) for x in load_start],
        "loadavg_after_ramp": [round(x, 2) for x in load_after_ramp],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "quick": args.quick,
    }
    reaction = report["reaction_epochs"]
    report["target_reaction_le_5"] = reaction is not None and reaction <= 5
    report["recommended_vs_best"] = (
        None
        if best is None or report["recommended_parallelism"] is None
        else round(report["recommended_parallelism"] / best, 3)
    )
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
