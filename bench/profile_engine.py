"""Where one engine epoch spends its time: ``python -m bench.profile_engine [--keys N ...]``.

Runs the engine's own task functions (`runners.engine.tasks.scan_partition`, or
`map_split` + `reduce_partition` for the shuffle routing) in this process, without Spark,
over the benchmark's generated epochs, planned the way the runner plans them (same `TaskPlan`,
same store, same key groups). For the last epoch (state already holding the keys) it prints:

- each task's time split into read+route+partial aggregate and merge+write (the tasks run one
  after the other here; Spark runs them in parallel on two cores);
- what reloading the parent state costs when the worker's memory cache misses: from the
  machine's disk cache, and from the store alone;
- the first half of a task step by step (read, hash, filter, partial aggregate);
- a cProfile of the epoch's tasks: top functions by cumulative time.

What Spark adds on top (scheduling, serialising the closure and the task reports) is the
difference between the runner's ``process_s`` and its ``map_s + reduce_s``, which
bench.engine reports per epoch. Output: text on stdout.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import pstats
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa


def _plan(job: Any, store_url: str, namespace: str, epoch: int, key_groups: dict, p: int) -> Any:
    from runners.engine.tasks import TaskPlan

    return TaskPlan(
        job=job,
        store_url=store_url,
        namespace=namespace,
        branch="main",
        epoch=epoch,
        parallelism=p,
        max_parallelism=128,
        key_groups=key_groups,
        processing_time_ms=epoch * 1000,
    )


def _run_epoch(
    plan: Any, splits: list, profile: cProfile.Profile | None = None, *, route: str = "scan"
) -> dict:
    """Run every task of one epoch in this process, routed like the runner routes it.

    ``scan``: each task reads every split and keeps its own key groups, one stage. ``split``:
    one map task per read piece (rows, not partials), shares routed, reduce tasks. ``shuffle``:
    map tasks (one per split, partials), shares routed, reduce tasks. Returns timings and the
    new key groups.
    """
    from runners.engine import routing, tasks

    timings: dict[str, Any] = {"map_s": [], "reduce_s": [], "task_s": [], "bytes_written": 0}
    key_groups = dict(plan.key_groups)

    def run(fn: Any, *a: Any) -> list:
        t0 = time.perf_counter()
        if profile:
            profile.enable()
        out = list(fn(*a))
        if profile:
            profile.disable()
        timings["task_s"].append(time.perf_counter() - t0)
        return out

    if route == "scan":
        timings["routing"] = "scan"
        for task in range(plan.parallelism):
            (result,) = run(tasks.scan_partition, plan, task, splits)
            timings["map_s"].append(result.map_s)
            timings["reduce_s"].append(result.reduce_s - result.map_s)
            key_groups.update(result.key_groups)
            timings["bytes_written"] += result.bytes_written
    else:
        timings["routing"] = route
        partial = route == "shuffle"
        shares: dict[int, list] = defaultdict(list)
        if partial:
            inputs = [(i, s, 0, 0) for i, s in enumerate(splits)]
        else:
            pieces = routing.pieces(plan.job.source, splits, plan.parallelism)
            inputs = [(q.split_index, q.split, q.part, q.first_row) for q in pieces]
        for index, split, part, first in inputs:
            mapper = functools.partial(tasks.map_split, part=part, first_row=first, partial=partial)
            for task, share in run(mapper, plan, index, split):
                shares[task].append((task, share))
        timings["map_s"] = list(timings["task_s"])
        for task in range(plan.parallelism):
            reducer = functools.partial(tasks.reduce_partition, partial=partial)
            (result,) = run(reducer, plan, task, shares[task])
            timings["reduce_s"].append(timings["task_s"][-1])
            key_groups.update(result.key_groups)
            timings["bytes_written"] += result.bytes_written
    timings["key_groups"] = key_groups
    return timings


def _r(values: list[float]) -> list[float]:
    return [round(v, 2) for v in values]


def _top(profile: cProfile.Profile, n: int) -> str:
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("cumulative").print_stats(n)
    text = out.getvalue()
    return text[text.find("   ncalls") :] if "   ncalls" in text else text


def _map_stages(job: Any, splits: list, task: int, p: int) -> list[tuple[str, float]]:
    """The first half of a scan task, step by step (mirrors tasks.scan_partition)."""
    from runners.engine.hashing import key_groups, owners
    from runners.engine.tasks import KG, _partial, _valid_rows, _with_seq

    steps: list[tuple[str, float]] = []
    t = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        steps.append((name, now - t))
        t = now

    tables = []
    for index, split in enumerate(splits):
        data = job.source.read(split)
        lap("read the epoch's Parquet (every task reads all of it)")
        table, _ = _valid_rows(data.table, job.key_columns, split)
        table = table.select(job.input_columns)
        lap("null-key check, select columns")
        groups = key_groups([table.column(c) for c in job.key_columns], 128)
        lap("murmur3 key group of every record (numpy)")
        mine = owners(groups, p, 128) == task
        table = _with_seq(table, index)
        table = table.append_column(KG, pa.array(groups, type=pa.int32())).filter(pa.array(mine))
        lap("keep this task's key groups (filter)")
        tables.append(table)
    merged = pa.concat_tables(tables)
    _partial(job, merged)
    lap("per-key partial aggregate of this task's records (pyarrow group_by)")
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_engine")
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--epochs", type=int, default=3, help="profiled epoch = the last")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--routing", default="scan", choices=("scan", "split", "shuffle"))
    parser.add_argument("--work-dir")
    args = parser.parse_args(argv)

    from bench.datagen import EpochSet
    from bench.engine import _engine_job
    from runners import config
    from runners.engine.state import memory_cache

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-profile-"))
    data = EpochSet(
        work / "data", keys=args.keys, records=args.records, epochs=args.epochs
    ).generate()
    store_url = f"file://{(work / 'store').resolve()}"
    namespace = f"profile-{int(time.time())}"
    job = _engine_job("profile", data, python=False)
    committed: dict[str, int] = {}
    key_groups: dict[int, tuple[str, ...]] = {}
    print(f"engine epoch profile: {args.keys:,} keys, {args.records:,} records/epoch, p=2, M=128")
    for epoch in range(1, args.epochs + 1):
        splits = job.source.plan(committed)
        plan = _plan(job, store_url, namespace, epoch, key_groups, 2)
        last = epoch == args.epochs
        if not last:
            t = _run_epoch(plan, splits, route=args.routing)
            print(
                f"epoch {epoch} ({t['routing']}): read+route+partial {_r(t['map_s'])} s, "
                f"merge+write {_r(t['reduce_s'])} s per task (setting up state)"
            )
        else:
            profile = cProfile.Profile()
            t = _run_epoch(plan, splits, profile, route=args.routing)
            print(
                f"epoch {epoch} (profiled; {t['routing']} routing, {len(splits)} split(s), "
                f"{plan.parallelism} tasks run one after the other here): per task "
                f"read+route+partial {_r(t['map_s'])} s, merge+write {_r(t['reduce_s'])} s; "
                f"bytes written {t['bytes_written'] / 1e6:.1f} MB"
            )
            # What a task pays when its parent state is not in this worker's memory cache:
            # from the machine's disk cache (when the engine has one), then from the store.
            from runners.engine.state.restore import load_key_group

            repo = plan.repo()
            chains = list(plan.key_groups.values())
            for label, disk in (("disk cache", True), ("store only (no caches)", False)):
                saved = config.current()
                if not disk:
                    config.use(replace(saved, state_cache_disk_bytes=0))
                memory_cache.cache_clear()
                c0 = time.perf_counter()
                for chain in chains:
                    load_key_group(repo, chain, job.key_columns)
                print(
                    f"parent state reload, memory cache cleared, {label}: {len(chains)} key "
                    f"groups in {time.perf_counter() - c0:.2f} s"
                )
                config.use(saved)
            print("\nfirst half of task 0, step by step:")
            for name, seconds in _map_stages(job, splits, 0, plan.parallelism):
                print(f"  {seconds:7.3f} s  {name}")
            print(f"\ncProfile of the epoch's tasks, top {args.top} by cumulative time:")
            print(_top(profile, args.top))
        from runners.engine.sources import end_offsets

        committed = end_offsets(committed, splits)
        key_groups = t["key_groups"]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
