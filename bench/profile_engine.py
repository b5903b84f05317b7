"""Where one engine epoch spends its time: ``python -m bench.profile_engine [--keys N ...]``.

Runs the engine's own task functions (`runners.engine.tasks.map_split` /
`reduce_partition`) in this process, without Spark, over the benchmark's generated epochs, the
way the runner plans them (same `TaskPlan`, same store, same key groups). For one steady epoch
(state already holding the keys) it reports:

- wall time of each map task (one per split) and each reduce task (one per key-group range),
  with the executor-local chunk cache warm (the previous epoch ran in this process);
- the cost of a cache miss: materialising every parent key group from the store (what a task
  pays when Spark schedules it on a Python worker that did not own that range last epoch);
- a cProfile of the map and of the (warm) reduce tasks: top functions by cumulative time.

Then a stage breakdown of the map task done by hand (read, hash, partial aggregate, route,
encode). Spark's own share (scheduling, pickling shares through the Python shuffle) is what the
runner's ``process_s`` adds on top of ``map_s + reduce_s``; bench.engine reports both.
Output: text on stdout.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
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


def _run_epoch(plan: Any, splits: list, profile: cProfile.Profile | None = None) -> dict:
    """Map every split, route shares, reduce every task; returns timings and new key groups."""
    from runners.engine.tasks import map_split, reduce_partition

    timings: dict[str, Any] = {"map_s": [], "reduce_s": []}
    shares: dict[int, list] = defaultdict(list)
    for index, split in enumerate(splits):
        t0 = time.perf_counter()
        if profile:
            profile.enable()
        produced = list(map_split(plan, index, split))
        if profile:
            profile.disable()
        timings["map_s"].append(time.perf_counter() - t0)
        for task, share in produced:
            shares[task].append((task, share))
    timings["share_bytes"] = sum(len(s.payload) for v in shares.values() for _, s in v)
    key_groups = dict(plan.key_groups)
    for task in range(plan.parallelism):
        t0 = time.perf_counter()
        if profile:
            profile.enable()
        (result,) = list(reduce_partition(plan, task, shares[task]))
        if profile:
            profile.disable()
        timings["reduce_s"].append(time.perf_counter() - t0)
        key_groups.update(result.key_groups)
        timings.setdefault("bytes_written", 0)
        timings["bytes_written"] += result.bytes_written
    timings["key_groups"] = key_groups
    timings["shares"] = shares
    return timings


def _top(profile: cProfile.Profile, n: int) -> str:
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("cumulative").print_stats(n)
    text = out.getvalue()
    return text[text.find("   ncalls") :] if "   ncalls" in text else text


def _map_stages(job: Any, split: Any) -> list[tuple[str, float]]:
    """The map task's steps one by one (mirrors runners.engine.tasks.map_split)."""
    import pyarrow.compute as pc

    from runners.engine import chunks
    from runners.engine.hashing import key_groups, owners
    from runners.engine.tasks import KG, _partial, _valid_rows

    steps: list[tuple[str, float]] = []
    t = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        steps.append((name, now - t))
        t = now

    data = job.source.read(split)
    lap("read Parquet split (whole row group, then slice)")
    table, _ = _valid_rows(data.table, job.key_columns, split)
    table = table.select(job.input_columns)
    lap("null-key check, select columns")
    groups = key_groups([table.column(c) for c in job.key_columns], 128)
    lap("murmur3 key groups (numpy)")
    table = table.append_column(KG, pa.array(groups, type=pa.int32()))
    table = _partial(job, table)
    lap("partial aggregate (pyarrow group_by)")
    groups = table.column(KG).to_numpy()
    owner = owners(np.asarray(groups), 2, 128)
    order = np.argsort(owner, kind="stable")
    table = table.take(pa.array(order))
    lap("route: owner, argsort, take")
    chunks.encode_table(table)
    lap("encode shares (Arrow IPC)")
    del pc
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_engine")
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--epochs", type=int, default=3, help="profiled epoch = the last")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--work-dir")
    args = parser.parse_args(argv)

    from bench.datagen import EpochSet
    from bench.engine import _engine_job
    from runners.engine import chunks

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
            t = _run_epoch(plan, splits)
            print(
                f"epoch {epoch}: map {[round(x, 2) for x in t['map_s']]} s, reduce "
                f"{[round(x, 2) for x in t['reduce_s']]} s (setting up state)"
            )
        else:
            profile = cProfile.Profile()
            t = _run_epoch(plan, splits, profile)
            print(
                f"epoch {epoch} (profiled, cache warm): {len(splits)} map tasks "
                f"{[round(x, 2) for x in t['map_s']]} s; {plan.parallelism} reduce tasks "
                f"{[round(x, 2) for x in t['reduce_s']]} s; shuffle payload "
                f"{t['share_bytes'] / 1e6:.1f} MB; bytes written {t['bytes_written'] / 1e6:.1f} MB"
            )
            # What a reduce task pays extra when Spark runs it on a Python worker that did not
            # own these key groups last epoch: materialising every parent chain from the store
            # (read, verify, zstd-decompress, Arrow decode, apply deltas) instead of the cache.
            from runners.engine.chunks import load_key_group

            chunks.cache_clear()
            c0 = time.perf_counter()
            repo = plan.repo()
            for chain in plan.key_groups.values():
                load_key_group(repo, chain, job.key_columns, None)
            cold = time.perf_counter() - c0
            print(
                f"cache miss cost: materialising all {len(plan.key_groups)} parent key groups "
                f"from the store takes {cold:.2f} s (split over the reduce tasks)"
            )
            print("\nmap task, step by step (first split):")
            for name, seconds in _map_stages(job, splits[0]):
                print(f"  {seconds:7.3f} s  {name}")
            print(f"\ncProfile of the epoch's tasks (map + warm reduce), top {args.top}:")
            print(_top(profile, args.top))
        from runners.engine.sources import end_offsets

        committed = end_offsets(committed, splits)
        key_groups = t["key_groups"]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
