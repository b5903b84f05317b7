"""The restore stage: how key groups are spread over its tasks, and what it leaves in the
machine-local state cache for the epoch's tasks (a one-chunk chain as the chunk's own payload,
a longer chain as an Arrow file), read back equal to the chain read from the store."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator
from multiprocessing import Queue
from pathlib import Path

import pyarrow as pa
import pytest

from runners import config
from runners.engine.aggregations import count
from runners.engine.job import Job
from runners.engine.sources import ParquetDirectory
from runners.engine.state import codec, disk_cache, memory_cache
from runners.engine.state.restore import (
    Claims,
    Restore,
    batches_of,
    load_key_group,
    load_key_groups,
    restore_claimed,
)
from runners.engine.tasks import TaskPlan, restore_batches, restore_partition, restore_tasks
from snapshots_store import Repository
from snapshots_store.errors import CorruptObjectError
from snapshots_store.objects import object_key
from snapshots_store.packs import split_ref


def test_restore_tasks_are_a_multiple_of_the_cores() -> None:
    assert restore_tasks(3, 2) == 4  # with 3, one core would idle for the last third
    assert restore_tasks(2, 2) == 2
    assert restore_tasks(4, 2) == 4
    assert restore_tasks(1, 2) == 2
    assert restore_tasks(5, 1) == 5
    assert restore_tasks(3, 0) == 3  # an unknown core count: one task per epoch task
    assert restore_tasks(3, 16) == 16


def _chunk(keys: list[str], deleted: list[bool] | None = None) -> bytes:
    table = pa.table({"key": keys, "n": list(range(len(keys)))})
    flags = None if deleted is None else pa.array(deleted).to_numpy(zero_copy_only=False)
    return codec.encode_table(codec.with_deleted(table, flags))


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    directory = tmp_path / "cache"
    monkeypatch.setenv(config.STATE_CACHE_DIR_ENV, str(directory))
    memory_cache.cache_clear()
    yield directory
    memory_cache.cache_clear()


def test_restored_chains_read_back_from_the_disk_cache_equal_to_the_store(
    tmp_path: Path, cache_dir: Path
) -> None:
    repo = Repository.open(f"file://{tmp_path / 'store'}", "app")
    payloads = {
        0: _chunk(["a", "b", "c"]),
        1: _chunk(["d", "e"], [False, True]),  # a base with a deleted row
        2: _chunk(["f"]),
    }
    refs = repo.put_chunks(payloads)
    delta = repo.put_chunks({2: _chunk(["f", "g"], [True, False])})[2]
    chains = {0: (refs[0],), 1: (refs[1],), 2: (refs[2], delta)}
    states, restore = load_key_groups(repo, chains, ["key"], disk=True)
    assert restore.stored_bytes == sum(repo.chunk_size(r) or 0 for c in chains.values() for r in c)
    assert restore.payload_bytes == sum(map(len, payloads.values())) + len(repo.read_chunk(delta))
    expected = {0: ["a", "b", "c"], 1: ["d"], 2: ["g"]}
    assert {kg: s.table.column("key").to_pylist() for kg, s in states.items()} == expected
    # one-chunk chains: the payload as it is (an Arrow stream); longer ones: an Arrow file
    assert Path(disk_cache.path_of(chains[0])).read_bytes() == payloads[0]
    assert Path(disk_cache.path_of(chains[2])).read_bytes()[:6] == b"ARROW1"
    memory_cache.cache_clear()  # another worker of the machine: only the disk cache
    for kg, chain in chains.items():
        cached = memory_cache.cache_get(chain)
        assert cached is not None, kg
        assert cached.table.equals(states[kg].table)
        assert cached.sizes == states[kg].sizes
        assert cached.table.equals(load_key_group(repo, chain, ["key"], use_cache=False).table)


def test_restore_tasks_load_every_key_group_once(tmp_path: Path, cache_dir: Path) -> None:
    repo = Repository.open(f"file://{tmp_path / 'store'}", "app")
    refs = repo.put_chunks({kg: _chunk([f"k{kg}"]) for kg in range(0, 32, 3)})
    job = Job(name="j", source=ParquetDirectory(str(tmp_path / "in")), key="key",
              aggregate=[count()])  # fmt: skip
    plan = TaskPlan(
        job=job,
        store_url=f"file://{tmp_path / 'store'}",
        namespace="app",
        branch="main",
        epoch=2,
        parallelism=3,
        max_parallelism=32,
        key_groups={kg: (r,) for kg, r in refs.items()},
        processing_time_ms=0,
    )
    tasks = restore_tasks(3, 2)
    loaded = []
    for index in range(tasks):
        (restore,) = restore_partition(plan, index, tasks)
        loaded.append(restore.stored_bytes)
        assert restore.stored_bytes > 0  # 11 key groups over 4 tasks: 2, 3, 3, 3
    assert sum(loaded) == sum(repo.chunk_size(r) or 0 for r in refs.values())


def test_batches_are_consecutive_near_equal_and_cover_every_key_group() -> None:
    groups = [9, 3, 0, 5, 7, 1, 2]
    batches = batches_of(groups, 3)
    assert batches == [[0, 1], [2, 3], [5, 7, 9]]
    assert batches_of(groups, 100) == [[g] for g in sorted(groups)]
    assert batches_of(groups, 0) == [sorted(groups)]
    assert restore_batches(128, 2) == 128  # one key group per batch
    assert restore_batches(32_768, 2) == 128
    assert restore_batches(3, 4) == 3


def _claim_all(directory: str, batches: int, out: Queue) -> None:  # type: ignore[type-arg]
    claims = Claims(directory, batches)
    mine = []
    while (batch := claims.claim()) is not None:
        mine.append(batch)
    out.put(mine)


def test_concurrent_processes_claim_each_batch_exactly_once(tmp_path: Path) -> None:
    """Claims are files created with O_EXCL: processes racing over one directory (the
    restore stage's tasks) take every batch once between them."""
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    workers = [context.Process(target=_claim_all, args=(str(tmp_path), 500, out)) for _ in range(3)]
    for worker in workers:
        worker.start()
    taken = [out.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    assert sorted(b for mine in taken for b in mine) == list(range(500))
    assert all(mine == sorted(mine) for mine in taken)  # each claims in order
    # a stage whose directory is gone (the driver cleaned up): nothing left to claim
    assert Claims(str(tmp_path / "gone"), 5).claim() is None


@pytest.mark.parametrize("read_ahead", [0, 1, config.RunnersConfig().restore_read_ahead_bytes])
def test_claiming_tasks_restore_every_key_group_exactly_once(
    tmp_path: Path, cache_dir: Path, read_ahead: int
) -> None:
    """Two restore tasks (each its own claims cursor, as two Python workers) running at once
    over one claims directory load every key group once between them, verified, into the
    disk cache, whatever the read-ahead window (none, one batch, the default)."""
    repo = Repository.open(f"file://{tmp_path / 'store'}", "app")
    refs = repo.put_chunks({kg: _chunk([f"k{kg}", f"j{kg}"]) for kg in range(40)}, pack_bytes=600)
    delta = repo.put_chunks({7: _chunk(["k7"], [True])})[7]
    chains = {kg: (r,) for kg, r in refs.items()} | {7: (refs[7], delta)}
    batches = batches_of(list(chains), 16)
    claims_dir = tmp_path / "claims"
    claims_dir.mkdir()
    results: dict[int, tuple[list[int], Restore]] = {}

    def task(index: int) -> None:
        claims = Claims(str(claims_dir), len(batches))
        results[index] = restore_claimed(
            repo, chains, batches, claims, ["key"], threads=3, read_ahead=read_ahead
        )

    threads = [threading.Thread(target=task, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    loaded = [kg for got, _ in results.values() for kg in got]
    assert sorted(loaded) == sorted(chains)  # each once
    stored = sum(repo.chunk_size(r) or 0 for chain in chains.values() for r in chain)
    assert sum(r.stored_bytes for _, r in results.values()) == stored
    assert sorted(int(p.name) for p in claims_dir.iterdir()) == list(range(len(batches)))
    memory_cache.cache_clear()  # another worker: the disk cache holds every chain
    for kg, chain in chains.items():
        cached = memory_cache.cache_get(chain)
        assert cached is not None, kg
        expected = load_key_group(repo, chain, ["key"], use_cache=False).table
        assert cached.table.equals(expected)
    assert memory_cache.cache_get(chains[7]).table.column("key").to_pylist() == ["j7"]  # type: ignore[union-attr]


def test_a_claiming_restore_raises_what_a_read_raises(tmp_path: Path, cache_dir: Path) -> None:
    """A damaged member fails the task (verification stays), it is not skipped."""
    repo = Repository.open(f"file://{tmp_path / 'store'}", "app")
    refs = repo.put_chunks({kg: _chunk([f"k{kg}"]) for kg in range(6)})
    pack = split_ref(refs[0])[0]
    index = repo.chunks.index(pack)
    stored = repo.backend.get(object_key(pack))
    assert stored is not None
    damaged = bytearray(stored.data)
    damaged[index.data_start + index.members[4].offset + 3] ^= 0x01
    repo.backend.put(object_key(pack), bytes(damaged))
    chains = {kg: (r,) for kg, r in refs.items()}
    batches = batches_of(list(chains), 6)
    claims = Claims(str(tmp_path), len(batches))
    with pytest.raises(CorruptObjectError, match="key group 4"):
        restore_claimed(repo, chains, batches, claims, ["key"], threads=2)


def test_restore_partition_with_claims_shares_the_key_groups(
    tmp_path: Path, cache_dir: Path
) -> None:
    """A task that runs while the others have not started takes every batch; one that
    starts after it finds none left (Spark ran them one after the other)."""
    repo = Repository.open(f"file://{tmp_path / 'store'}", "app")
    refs = repo.put_chunks({kg: _chunk([f"k{kg}"]) for kg in range(0, 32, 3)})
    job = Job(name="j", source=ParquetDirectory(str(tmp_path / "in")), key="key",
              aggregate=[count()])  # fmt: skip
    plan = TaskPlan(job=job, store_url=f"file://{tmp_path / 'store'}", namespace="app",
                    branch="main", epoch=2, parallelism=3, max_parallelism=32,
                    key_groups={kg: (r,) for kg, r in refs.items()},
                    processing_time_ms=0)  # fmt: skip
    claims = tmp_path / "claims"
    claims.mkdir()
    (first,) = restore_partition(plan, 0, 2, str(claims))
    (second,) = restore_partition(plan, 1, 2, str(claims))
    assert first.stored_bytes == sum(repo.chunk_size(r) or 0 for r in refs.values())
    assert second.stored_bytes == 0 and second.started == 0.0
    assert len(list(claims.iterdir())) == restore_batches(len(refs), 2) == len(refs)
