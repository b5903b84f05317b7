"""The restore stage: how key groups are spread over its tasks, and what it leaves in the
machine-local state cache for the epoch's tasks (a one-chunk chain as the chunk's own payload,
a longer chain as an Arrow file), read back equal to the chain read from the store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from runners.engine import chunks
from runners.engine.aggregations import count
from runners.engine.job import Job
from runners.engine.sources import ParquetDirectory
from runners.engine.tasks import TaskPlan, restore_partition, restore_tasks
from snapshots_store import Repository


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
    return chunks.encode_table(chunks.with_deleted(table, flags))


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    directory = tmp_path / "cache"
    monkeypatch.setenv(chunks.DISK_CACHE_ENV, str(directory))
    chunks.cache_clear()
    yield directory
    chunks.cache_clear()


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
    states, restore = chunks.load_key_groups(repo, chains, ["key"], disk=True)
    assert restore.stored_bytes == sum(repo.chunk_size(r) or 0 for c in chains.values() for r in c)
    assert restore.payload_bytes == sum(map(len, payloads.values())) + len(repo.read_chunk(delta))
    expected = {0: ["a", "b", "c"], 1: ["d"], 2: ["g"]}
    assert {kg: s.table.column("key").to_pylist() for kg, s in states.items()} == expected
    # one-chunk chains: the payload as it is (an Arrow stream); longer ones: an Arrow file
    assert Path(chunks._disk_path(chains[0])).read_bytes() == payloads[0]
    assert Path(chunks._disk_path(chains[2])).read_bytes()[:6] == b"ARROW1"
    chunks.cache_clear()  # another worker of the machine: only the disk cache
    for kg, chain in chains.items():
        cached = chunks.cache_get(chain)
        assert cached is not None, kg
        assert cached.table.equals(states[kg].table)
        assert cached.sizes == states[kg].sizes
        assert cached.table.equals(
            chunks.load_key_group(repo, chain, ["key"], use_cache=False).table
        )


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
