"""Routing: the split routing (each task reads only its piece of the input) writes the same
snapshots as the scan routing, and `auto` picks the routing the rules say."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from runners.engine import EpochRunner, Job, read_dead_letters, read_output, routing, sources
from runners.engine import aggregations as agg
from runners.engine.exchange import EXCHANGE_DIR_ENV
from runners.engine.sources import ParquetDirectory, balanced_pieces, write_parquet_file
from snapshots_store import Repository
from tests.engine.jobs import running_total

ROWS = 1_200
ROW_GROUP = 150  # 8 row groups per file: the split routing reads a file in pieces


def _epoch_table(epoch: int) -> pa.Table:
    rng = np.random.default_rng([11, epoch])
    ids = rng.integers(0, 300, ROWS)
    keys = pa.array([None if i % 97 == 5 else f"k{k}" for i, k in enumerate(ids)], pa.string())
    return pa.table(
        {
            "key": keys,  # a few null keys: dead letters
            "value": pa.array(rng.integers(0, 1000, ROWS)),
            "amount": pa.array(rng.random(ROWS) * 1e6 - 5e5),  # float sums: order-sensitive
            "ts": pa.array(np.arange(epoch * ROWS, (epoch + 1) * ROWS, dtype=np.int64)),
        }
    )


@pytest.fixture(scope="module")
def grouped_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """3 epoch files of 1,200 records in row groups of 150."""
    directory = str(tmp_path_factory.mktemp("grouped") / "in")
    for epoch in range(3):
        write_parquet_file(directory, f"part-{epoch:05d}", _epoch_table(epoch), ROW_GROUP)
    return directory


def _aggregate_job(directory: str) -> Job:
    return Job(
        name="routed",
        source=sources.ParquetDirectory(directory),  # one split per file
        key="key",
        aggregate=[
            agg.count(),
            agg.sum("amount"),
            agg.max("value"),
            agg.last("value"),
            agg.distinct_count("value"),
            agg.windowed_count("ts", 400),
        ],
        time_mode="logical",
    )


def _process_job(directory: str) -> Job:
    return Job(
        name="routed-python",
        source=sources.ParquetDirectory(directory),
        key="key",
        process=running_total,
        time_mode="logical",
    )


def _run(
    spark: Any, job: Job, root: Path, name: str, p: int, how: str, *, files: bool = True
) -> Repository:
    repo = Repository.open(f"file://{root}/{name}", "routing")
    runner = EpochRunner(spark, job, repo=repo, parallelism=p, routing=how)
    if not files:
        runner.exchange_root = None  # as on a cluster without a shared exchange directory
    runner.run()
    return repo


def _history(repo: Repository) -> list[tuple[Any, ...]]:
    manifests = []
    rev = repo.resolve("main")
    while rev is not None:
        m = repo.read_manifest(rev)
        stats = (m.stats["records_in"], m.stats["output_rows"], m.stats["dead_letters"])
        manifests.append((m.epoch, m.key_groups, m.outputs, stats, m.extra["routing"]))
        rev = m.parents[0] if m.parents else None
    return manifests[::-1]


@pytest.mark.spark
@pytest.mark.parametrize("kind", ["aggregate", "process"])
def test_split_routing_writes_byte_identical_snapshots_to_scan(
    spark: Any, grouped_dir: str, tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    exchange_dir = tmp_path / "exchange"
    monkeypatch.setenv(EXCHANGE_DIR_ENV, str(exchange_dir))
    job = (_aggregate_job if kind == "aggregate" else _process_job)(grouped_dir)
    # p = 2 on local[2]: both tasks run at once and each maps its own piece; p = 3: more tasks
    # than slots, so running tasks take over the pieces of one not started yet (p = 3 divides
    # a file into 3 pieces); files=False: Spark's shuffle carries the rows
    for p, files in ((2, True), (3, True), (2, False)):
        scan_repo = _run(spark, job, tmp_path, f"scan{p}{files}", p, "scan")
        how = "auto" if files else "split"
        split_repo = _run(spark, job, tmp_path, f"split{p}{files}", p, how, files=files)
        scan, split = _history(scan_repo), _history(split_repo)
        assert [h[4] for h in scan] == ["scan"] * 3
        assert [h[4] for h in split] == ["split"] * 3  # auto picked it: the files divide
        # per epoch: the same chunks, output objects, dead letters and counts
        assert [h[:4] for h in split] == [h[:4] for h in scan]
        assert read_output(split_repo, "main").equals(read_output(scan_repo, "main"))
        dead = read_dead_letters(split_repo, "main")
        assert dead.equals(read_dead_letters(scan_repo, "main"))
        assert dead.num_rows == 3 * len(range(5, ROWS, 97))
    assert os.listdir(exchange_dir) == []  # every epoch's exchange files were removed


@pytest.mark.spark
def test_auto_does_not_pick_split_without_an_exchange_directory(
    spark: Any, grouped_dir: str, tmp_path: Path
) -> None:
    repo = _run(spark, _aggregate_job(grouped_dir), tmp_path, "noex", 2, "auto", files=False)
    assert [h[4] for h in _history(repo)] == ["scan"] * 3  # Spark's shuffle would cost more


def test_parquet_pieces_follow_row_groups_and_cover_the_split(grouped_dir: str) -> None:
    source = ParquetDirectory(grouped_dir)
    (split,) = source.plan({})
    pieces = routing.pieces(source, [split], 2)
    assert [(q.split.start, q.split.end, q.first_row) for q in pieces] == [
        (0, 600, 0),
        (600, 1200, 600),
    ]
    assert [q.part for q in pieces] == [0, 1]
    # a split starting mid-file (committed offsets) is divided at the row groups it spans
    (later,) = source.plan({"part-00000.parquet": 450})
    cut = routing.pieces(source, [later], 3)
    assert [(q.split.start, q.split.end, q.first_row) for q in cut] == [
        (450, 750, 0),
        (750, 900, 300),
        (900, 1200, 450),
    ]
    # reading the pieces gives the split's rows, in order
    whole = source.read(later).table
    parts = pa.concat_tables([source.read(q.split).table for q in cut])
    assert parts.equals(whole)


def test_one_row_group_or_an_undividable_source_stays_whole(tmp_path: Path) -> None:
    directory = str(tmp_path / "one")
    write_parquet_file(directory, "part-00000", _epoch_table(0))  # pyarrow default: 1 group
    source = ParquetDirectory(directory)
    assert pq.read_metadata(os.path.join(directory, "part-00000.parquet")).num_row_groups == 1
    assert len(routing.pieces(source, source.plan({}), 4)) == 1
    generator = sources.Generator(keys=10, records_per_epoch=100, seed=1, epochs=1)
    assert len(routing.pieces(generator, generator.plan({}), 4)) == 1


def test_balanced_pieces() -> None:
    cuts = [125, 250, 375, 500, 625, 750, 875]
    assert balanced_pieces(0, 1000, cuts, 2) == [(0, 500), (500, 1000)]
    assert balanced_pieces(0, 1000, cuts, 3) == [(0, 375), (375, 625), (625, 1000)]
    assert balanced_pieces(0, 1000, [], 4) == [(0, 1000)]
    assert balanced_pieces(0, 1000, [950], 2) == [(0, 1000)]  # too far from a fair share
    assert balanced_pieces(0, 10, list(range(1, 10)), 20) == [(i, i + 1) for i in range(10)]


@pytest.mark.parametrize(
    ("asked", "p", "pieces", "expected"),
    [
        ("auto", 1, 8, "scan"),  # one task: a single read, nothing to exchange
        ("auto", 2, 2, "split"),
        ("auto", 8, 3, "split"),
        ("auto", 2, 1, "scan"),  # the input does not divide: scanning beats a one-task map
        ("auto", 3, 1, "shuffle"),
        ("scan", 4, 8, "scan"),
        ("shuffle", 2, 8, "shuffle"),
        ("split", 1, 1, "split"),
    ],
)
def test_routing_choice(asked: str, p: int, pieces: int, expected: str) -> None:
    assert routing.choose(asked, p, pieces, 2) == expected


def test_unknown_routing_is_refused_naming_the_choices(spark: Any, grouped_dir: str) -> None:
    repo = Repository.open("file:///nonexistent-epochal-store", "x")
    with pytest.raises(ValueError, match="auto, scan, split, shuffle, not 'fast'"):
        EpochRunner(spark, _aggregate_job(grouped_dir), repo=repo, routing="fast")


def test_a_task_maps_unclaimed_pieces_of_a_task_not_started_instead_of_waiting(
    grouped_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Split routing with fewer slots than tasks: task 0 of 2 runs while task 1 has not
    started. Task 0 claims and maps task 1's pieces at once — it waits for no piece, since none
    is claimed by anyone else — and task 1, when it runs, finds every piece published and maps
    nothing; both reduce what a scan would."""
    from runners.engine import exchange, routing
    from runners.engine.tasks import TaskPlan, split_partition

    waited: list[tuple[int, int]] = []
    real_wait = exchange.wait_published

    def spy(directory: str, key: tuple[int, int], timeout_s: float) -> Any:
        waited.append(key)
        return real_wait(directory, key, timeout_s)

    monkeypatch.setattr(exchange, "wait_published", spy)
    job = _aggregate_job(grouped_dir)
    splits = job.source.plan({})
    pieces = routing.pieces(job.source, splits, 2)
    assert len(pieces) == 2  # the file of 8 row groups in two pieces, one per task
    plan = TaskPlan(
        job=job,
        store_url=f"file://{tmp_path}/store",
        namespace="routing",
        branch="main",
        epoch=1,
        parallelism=2,
        max_parallelism=128,
        key_groups={},
        processing_time_ms=0,
    )
    directory = str(tmp_path / "exchange")
    os.makedirs(directory)
    first = list(split_partition(plan, 0, pieces, directory))
    assert waited == [], "task 0 waited for a piece nobody had claimed"
    assert all(exchange.published(directory, (q.split_index, q.part)) for q in pieces)
    second = list(split_partition(plan, 1, pieces, directory))
    assert waited == [] and second[0].busy_s == second[0].reduce_s  # task 1 mapped nothing
    assert first[0].records_in + second[0].records_in == ROWS * len(splits)
