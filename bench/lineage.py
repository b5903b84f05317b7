"""Lineage index benchmark: `python -m bench.lineage [--snapshots N --branches B --samples S]`.

1. Builds a synthetic lineage (forks, rollbacks, a few merges) of N snapshots over B branches in
   the index on the configured database (`DATABASE_URL`), placing snapshots on chains with the
   same code the services use, and bulk-loading rows (COPY on PostgreSQL).
2. Measures p50/p99 latency of the selectors: first-parent log of 100, full log of 100,
   an ancestors page of 100, merge base of two branch heads, is-ancestor.
3. Commits a smaller lineage through `snapshots_store.Repository.commit` into a temporary
   store, reindexes it into a fresh application and reports snapshots per second.

Progress goes to stderr; the last stdout line is one JSON object. Nothing is compared with a
fixed figure: the numbers are what this machine measured.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

BENCH_APPLICATION = "bench-lineage"
BENCH_REINDEX_APPLICATION = "bench-lineage-reindex"
BASE_TIME = datetime(2026, 1, 1, tzinfo=UTC)


def log(message: str) -> None:
    print(f"[bench.lineage {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- the synthetic lineage ------------------------------------------------------------------


@dataclass(frozen=True)
class Commit:
    branch: int
    parents: tuple[int, ...]
    kind: str


@dataclass(frozen=True)
class Rollback:
    branch: int
    target: int


@dataclass
class SyntheticLineage:
    """Events in commit order; snapshot i is the i-th Commit event."""

    branches: list[str] = field(default_factory=list)
    heads: list[int] = field(default_factory=list)
    first_parent: list[int] = field(default_factory=list)
    commits: int = 0
    forks: int = 0
    rollbacks: int = 0
    merges: int = 0


def synthesize(
    *,
    snapshots: int,
    branches: int,
    seed: int,
    rollback_rate: float = 0.002,
    merge_rate: float = 0.0002,
) -> Iterator[tuple[SyntheticLineage, Commit | Rollback]]:
    """Yield (state, event): commits on random branches, forks spread evenly over the run
    (from a recent snapshot of a random branch), rollbacks of 1..30 commits, rare merges."""
    rng = random.Random(seed)
    state = SyntheticLineage()
    fork_every = max(1, snapshots // max(1, branches))

    def back(snapshot: int, steps: int) -> int:
        for _ in range(steps):
            parent = state.first_parent[snapshot]
            if parent < 0:
                break
            snapshot = parent
        return snapshot

    def commit(branch: int, parents: tuple[int, ...], kind: str) -> Commit:
        index = state.commits
        state.commits += 1
        state.first_parent.append(parents[0] if parents else -1)
        state.heads[branch] = index
        return Commit(branch, parents, kind)

    state.branches.append("main")
    state.heads.append(-1)
    yield state, commit(0, (), "initial")
    while state.commits < snapshots:
        n_branches = len(state.branches)
        if n_branches < branches and state.commits % fork_every == 0:
            source = back(state.heads[rng.randrange(n_branches)], rng.randint(0, 20))
            state.branches.append(f"b{n_branches:05d}")
            state.heads.append(source)
            state.forks += 1
            yield state, commit(n_branches, (source,), "fork")
            continue
        branch = rng.randrange(n_branches)
        head = state.heads[branch]
        roll = rng.random()
        if roll < rollback_rate:
            target = back(head, rng.randint(1, 30))
            if target != head:
                state.rollbacks += 1
                state.heads[branch] = target
                yield state, Rollback(branch, target)
                continue
        if roll > 1 - merge_rate and n_branches > 1:
            other = state.heads[rng.randrange(n_branches)]
            if other != head:
                state.merges += 1
                yield state, commit(branch, (head, other), "epoch")
                continue
        kind = "rescale" if rng.random() < 0.01 else "epoch"
        yield state, commit(branch, (head,), kind)


def synthetic_id(index: int, salt: str) -> str:
    return hashlib.sha256(f"{salt}:{index}".encode()).hexdigest()


# -- bulk load into the index ---------------------------------------------------------------


def build_index(
    *, snapshots: int, branches: int, seed: int, name: str = BENCH_APPLICATION
) -> dict[str, Any]:
    """Replace application `name`'s index with a synthetic lineage; returns facts.

    Placement uses the services' `ChainPlanner`; rows go in through the services' bulk
    writer (COPY on PostgreSQL) with reserved keys, in the services' column order.
    """
    from django.db import connection, transaction

    from controlplane.applications.models import Application
    from controlplane.lineage.bulk import insert_rows, reserve_ids
    from controlplane.lineage.chains import ChainPlanner
    from controlplane.lineage.models import Branch, Chain, ChainEdge, Snapshot, SnapshotParent
    from controlplane.lineage.services import (
        CHAIN_COLUMNS,
        EDGE_COLUMNS,
        PARENT_COLUMNS,
        SNAPSHOT_COLUMNS,
        edge_row,
    )

    started = time.monotonic()
    _drop_application(name)
    application = Application.objects.create(name=name, store_namespace=name, max_parallelism=128)
    commits: list[Commit] = []
    state: SyntheticLineage | None = None
    for current, event in synthesize(snapshots=snapshots, branches=branches, seed=seed):
        state = current
        if isinstance(event, Commit):
            commits.append(event)
    assert state is not None
    ids = [synthetic_id(i, name) for i in range(len(commits))]
    provisional = iter(range(1, len(commits) + 1))
    planner = ChainPlanner(new_chain=lambda: next(provisional))
    placements = [planner.place(i, c.parents) for i, c in enumerate(commits)]
    roots = {p.chain: p.generation for p in placements if p.opens_chain}
    log(
        f"synthesized {len(commits):,} snapshots on {len(roots):,} chains: {state.forks} forks, "
        f"{state.rollbacks} rollbacks, {state.merges} merges "
        f"({time.monotonic() - started:.1f}s); loading"
    )

    with transaction.atomic():
        pks = reserve_ids(Snapshot, len(commits))
        chain_ids = dict(zip(sorted(roots), reserve_ids(Chain, len(roots)), strict=True))
        real = chain_ids.__getitem__
        epochs: list[int] = []
        for c in commits:
            epochs.append(epochs[c.parents[0]] + 1 if c.parents else 0)

        def snapshot_rows() -> Iterator[tuple[Any, ...]]:
            for i, (c, p) in enumerate(zip(commits, placements, strict=True)):
                yield (
                    pks[i],
                    application.pk,
                    ids[i],
                    state.branches[c.branch],
                    epochs[i],
                    c.kind,
                    4,
                    128,
                    "v1",
                    "cfg",
                    "",
                    BASE_TIME + timedelta(milliseconds=i),
                    json.dumps({"src": {"0": epochs[i] * 100}}),
                    json.dumps({"records_in": 100, "records_out": 100}),
                    "{}",
                    json.dumps([ids[x] for x in c.parents]),
                    len(c.parents),
                    pks[c.parents[0]] if c.parents else None,
                    p.generation,
                    real(p.chain),
                    "{}",
                )
                if i and i % 200_000 == 0:
                    log(f"  {i:,} snapshot rows written")

        tables = [
            (
                Chain,
                CHAIN_COLUMNS,
                [(real(c), application.pk, root, planner.tips[c]) for c, root in roots.items()],
            ),
            (Snapshot, SNAPSHOT_COLUMNS, snapshot_rows()),
            (
                SnapshotParent,
                PARENT_COLUMNS,
                (
                    (pks[i], pks[parent], position)
                    for i, c in enumerate(commits)
                    for position, parent in enumerate(c.parents)
                ),
            ),
            (ChainEdge, EDGE_COLUMNS, (edge_row(e, real) for p in placements for e in p.edges)),
            (
                Branch,
                ("application_id", "name", "head_id", "reflog_seq"),
                [
                    (application.pk, name, pks[head], 1)
                    for name, head in zip(state.branches, state.heads, strict=True)
                ],
            ),
        ]
        counts = {}
        for model, columns, rows in tables:
            t = time.monotonic()
            counts[model.__name__] = n = insert_rows(model, columns, rows)
            log(f"loaded {n:,} {model.__name__} rows in {time.monotonic() - t:.1f}s")
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            for model in (Chain, Snapshot, SnapshotParent, ChainEdge, Branch):
                cursor.execute(f"ANALYZE {model._meta.db_table}")
    build_s = time.monotonic() - started
    log(f"index built in {build_s:.1f}s")
    return {
        "application": application,
        "branch_names": list(state.branches),
        "snapshot_ids": ids,
        "chains": counts["Chain"],
        "chain_edges": counts["ChainEdge"],
        "forks": state.forks,
        "rollbacks": state.rollbacks,
        "merges": state.merges,
        "build_s": build_s,
    }


def _drop_application(name: str) -> None:
    """Remove an application and its index quickly (raw deletes, children first)."""
    from django.db import connection, transaction

    from controlplane.applications.models import Application
    from controlplane.lineage.models import (
        Branch,
        Chain,
        ChainEdge,
        ReflogEntry,
        Snapshot,
        SnapshotParent,
        Tag,
    )

    app = Application.objects.filter(name=name).first()
    if app is None:
        return
    log(f"dropping the {name!r} index (row-by-row foreign-key checks: minutes at 1M rows)")
    t = {m: m._meta.db_table for m in (Branch, Chain, ChainEdge, ReflogEntry, Snapshot, Tag)}
    parent_table = SnapshotParent._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        for model in (Branch, Tag, ReflogEntry):
            cursor.execute(f"DELETE FROM {t[model]} WHERE application_id = %s", [app.pk])
        cursor.execute(
            f"DELETE FROM {parent_table} WHERE child_id IN "
            f"(SELECT id FROM {t[Snapshot]} WHERE application_id = %s)",
            [app.pk],
        )
        cursor.execute(
            f"DELETE FROM {t[ChainEdge]} WHERE from_chain_id IN "
            f"(SELECT id FROM {t[Chain]} WHERE application_id = %s)",
            [app.pk],
        )
        # Foreign keys are checked at commit (deferred), so the order inside is free.
        cursor.execute(f"DELETE FROM {t[Snapshot]} WHERE application_id = %s", [app.pk])
        cursor.execute(f"DELETE FROM {t[Chain]} WHERE application_id = %s", [app.pk])
        app.delete()


# -- measuring ------------------------------------------------------------------------------


def timed(calls: list[Callable[[], object]]) -> dict[str, float]:
    """p50/p99 in ms over `calls` (after a short warm-up with the first few)."""
    for call in calls[:20]:
        call()
    durations: list[float] = []
    for call in calls:
        started = time.perf_counter()
        call()
        durations.append((time.perf_counter() - started) * 1000)
    durations.sort()
    return {
        "p50": statistics.median(durations),
        "p99": durations[min(len(durations) - 1, int(len(durations) * 0.99))],
    }


def measure(facts: dict[str, Any], *, samples: int, seed: int) -> dict[str, float]:
    """Selector latencies from random starts: half branch heads, half snapshots anywhere."""
    from functools import partial

    from controlplane.lineage import selectors

    app = facts["application"]
    rng = random.Random(seed + 1)
    ids: list[str] = facts["snapshot_ids"]
    heads = [f"heads/{name}" for name in facts["branch_names"]]
    revs = [
        heads[rng.randrange(len(heads))] if i % 2 else ids[rng.randrange(len(ids))]
        for i in range(samples + 1)
    ]
    pairs = list(zip(revs, revs[1:] + revs[:1], strict=True))[:samples]
    revs = revs[:samples]
    cases: dict[str, list[Callable[[], object]]] = {
        "log100": [
            partial(selectors.snapshot_log, application=app, rev=r, first_parent=True, limit=100)
            for r in revs
        ],
        "log100_full": [
            partial(selectors.snapshot_log, application=app, rev=r, limit=100) for r in revs
        ],
        "ancestors": [
            partial(selectors.snapshot_ancestors, application=app, rev=r, limit=100) for r in revs
        ],
        "merge_base": [
            partial(selectors.snapshot_merge_base, application=app, a=a, b=b) for a, b in pairs
        ],
        "is_ancestor": [
            partial(selectors.snapshot_is_ancestor, application=app, ancestor=a, descendant=b)
            for a, b in pairs
        ],
    }
    results: dict[str, float] = {}
    for name, calls in cases.items():
        stats = timed(calls)
        results[f"{name}_p50_ms"] = round(stats["p50"], 3)
        results[f"{name}_p99_ms"] = round(stats["p99"], 3)
        log(f"{name}: p50 {stats['p50']:.2f} ms, p99 {stats['p99']:.2f} ms")
    return results


# -- reindex throughput from a real store ---------------------------------------------------


def measure_reindex(*, snapshots: int, branches: int, seed: int) -> dict[str, float]:
    from controlplane.applications.models import Application
    from controlplane.lineage.services import reindex_application
    from snapshots_store import Manifest, Repository
    from snapshots_store.codec import format_timestamp

    with tempfile.TemporaryDirectory(prefix="bench-lineage-store-") as root:
        repo = Repository.open(f"file://{root}", "bench")
        ids: list[str] = []
        epochs: list[int] = []
        started = time.monotonic()
        for state, event in synthesize(snapshots=snapshots, branches=branches, seed=seed):
            name = state.branches[event.branch]
            if isinstance(event, Rollback):
                current = repo.read_ref(f"heads/{name}")
                assert current is not None
                repo.cas_ref(f"heads/{name}", current.target, ids[event.target], reason="rollback")
                continue
            index = len(ids)
            parents = tuple(ids[p] for p in event.parents)
            epoch = epochs[event.parents[0]] + 1 if event.parents else 0
            epochs.append(epoch)
            manifest = Manifest(
                branch=name,
                epoch=epoch,
                parents=parents,
                max_parallelism=128,
                parallelism=4,
                kind=event.kind,
                offsets={"src": {"0": epoch * 100}},
                stats={"records_in": 100},
                created_at=format_timestamp(BASE_TIME + timedelta(milliseconds=index)),
            )
            current = repo.read_ref(f"heads/{name}")
            expected = current.target if current is not None else None
            ids.append(repo.commit(manifest, name, expected_head=expected, reason="epoch"))
            if index % 5000 == 0:
                log(f"store: committed {index:,} snapshots")
        commit_s = time.monotonic() - started
        log(f"store: {len(ids):,} commits in {commit_s:.1f}s; reindexing")
        _drop_application(BENCH_REINDEX_APPLICATION)
        application = Application.objects.create(
            name=BENCH_REINDEX_APPLICATION, store_namespace="bench", max_parallelism=128
        )
        fresh = Repository.open(f"file://{root}", "bench")  # cold manifest cache
        result = reindex_application(application=application, repo=fresh)
        again = reindex_application(application=application, repo=fresh)
        _drop_application(BENCH_REINDEX_APPLICATION)
    log(
        f"reindex: {result.snapshots_added:,} snapshots in {result.seconds:.1f}s "
        f"({result.snapshots_per_s:,.0f}/s); no-op reindex {again.seconds:.2f}s"
    )
    return {
        "reindex_snapshots": result.snapshots_added,
        "reindex_seconds": round(result.seconds, 3),
        "reindex_snapshots_per_s": round(result.snapshots_per_s, 1),
        "reindex_noop_seconds": round(again.seconds, 3),
        "store_commits_per_s": round(len(ids) / commit_s, 1),
    }


# -- entry point ----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lineage", description=__doc__)
    parser.add_argument("--snapshots", type=int, default=1_000_000)
    parser.add_argument("--branches", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--reindex-snapshots", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the synthetic index afterwards")
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    log(f"database: {connection.vendor}; building {args.snapshots:,} snapshots")
    facts = build_index(snapshots=args.snapshots, branches=args.branches, seed=args.seed)
    results: dict[str, Any] = {
        "snapshots": len(facts["snapshot_ids"]),
        "branches": len(facts["branch_names"]),
        "forks": facts["forks"],
        "rollbacks": facts["rollbacks"],
        "merges": facts["merges"],
        "chains": facts["chains"],
        "chain_edges": facts["chain_edges"],
        "database": connection.vendor,
        "build_seconds": round(facts["build_s"], 1),
        "samples": args.samples,
        "page_size": 100,
    }
    # Context, not a verdict: latency tails follow how busy the machine is.
    results["cpus"] = os.cpu_count()
    results["loadavg_1m_before"] = round(os.getloadavg()[0], 2)
    results.update(measure(facts, samples=args.samples, seed=args.seed))
    results["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    if not args.keep:
        _drop_application(BENCH_APPLICATION)
    reindex_branches = max(1, args.branches * args.reindex_snapshots // max(1, args.snapshots))
    results.update(
        measure_reindex(snapshots=args.reindex_snapshots, branches=reindex_branches, seed=args.seed)
    )
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
