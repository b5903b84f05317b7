"""The one chunk writer: STARTED -> PREPARED -> COMPLETE / FAILED, and every misuse refused
with an error saying what to do (a write after prepare would never reach a chain)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from runners.engine.state.codec import with_deleted
from runners.engine.state.restore import load_key_group
from runners.engine.state.writer import ChunkWriter, ChunkWriterError, WriterState
from snapshots_store import Repository, StoreError


def _table(keys: list[str], start: int = 0) -> pa.Table:
    return pa.table({"key": keys, "n": list(range(start, start + len(keys)))})


@pytest.fixture
def repo(tmp_path: Path) -> Repository:
    return Repository.open(f"file://{tmp_path}/store", "writer")


def test_prepared_chains_read_back_and_later_writes_are_refused(repo: Repository) -> None:
    with ChunkWriter(repo) as writer:
        writer.write_base(3, _table(["a", "b"]))
        writer.write_base(7, _table(["c"]))
        assert writer.state is WriterState.STARTED and writer.chains == {}  # only queued
        chains = writer.prepare()
        assert writer.state is WriterState.PREPARED
        with pytest.raises(ChunkWriterError, match="cannot write: the chunk writer is prepared"):
            writer.write_base(9, _table(["d"]))
        with pytest.raises(ChunkWriterError, match="cannot prepare"):
            writer.prepare()
    assert writer.state is WriterState.COMPLETE
    assert sorted(chains) == [3, 7] and all(len(c) == 1 for c in chains.values())
    assert load_key_group(repo, chains[3], ["key"], use_cache=False).table.equals(
        _table(["a", "b"])
    )
    assert writer.bytes_written > 0 and writer.chunks_written == 2
    with pytest.raises(ChunkWriterError, match="complete: start a new writer"):
        writer.write_base(1, _table(["e"]))


def test_an_epoch_write_appends_a_delta_then_compacts(repo: Repository) -> None:
    with ChunkWriter(repo) as first:
        first.write_base(0, _table(["a", "b", "c"]))
        [base] = first.prepare().values()
    old = load_key_group(repo, base, ["key"], use_cache=False)
    changed = _table(["b"], start=10)
    new_state = pa.concat_tables([old.table.take([0, 2]), changed])  # a, c kept; b changed
    with ChunkWriter(repo, compaction_ratio=1.0) as writer:
        writer.write(0, old, new_state, with_deleted(changed))
        chain = writer.prepare()[0]
    assert chain[0] == base[0] and len(chain) == 2  # a delta after the base
    assert writer.output_refs == [(chain[1], 0, 1)]  # the delta's one changed row
    read = load_key_group(repo, chain, ["key"], use_cache=False).table
    assert read.sort_by("key").equals(new_state.sort_by("key"))
    with ChunkWriter(repo, compaction_ratio=0.0) as writer:  # no deltas allowed: a new base
        writer.write(0, old, new_state, with_deleted(changed))
        assert len(writer.prepare()[0]) == 1
    assert writer.output_refs[0][1:] == (2, 1)  # the changed row is the new base's last


def test_misuse_is_refused_naming_what_to_do(repo: Repository) -> None:
    writer = ChunkWriter(repo)
    with pytest.raises(ChunkWriterError, match=r"started, not prepared \(prepare\(\) it first"):
        writer.complete()
    with pytest.raises(ChunkWriterError, match="closed without prepare"), ChunkWriter(repo) as w:
        w.write_base(0, _table(["a"]))
    unprepared = w
    assert unprepared.state is WriterState.FAILED
    with pytest.raises(ZeroDivisionError), ChunkWriter(repo) as raising:
        raising.write_base(0, _table(["a"]))
        _ = 1 // 0
    assert raising.state is WriterState.FAILED
    with pytest.raises(ChunkWriterError, match=r"failed, not started .*retry with a new writer"):
        raising.write_base(1, _table(["b"]))
    assert raising.chains == {}  # nothing it queued became a chain


def test_a_store_that_fails_leaves_the_writer_failed(repo: Repository, tmp_path: Path) -> None:
    with ChunkWriter(repo) as earlier:
        earlier.write_base(0, _table(["a"]))
        earlier.prepare()
    writer = ChunkWriter(repo)
    writer.write_base(0, _table(["b"]))
    shutil.rmtree(tmp_path / "store")
    (tmp_path / "store").write_text("not a directory: every write into the store fails")
    with pytest.raises(StoreError, match="cannot create"):
        writer.prepare()
    assert writer.state is WriterState.FAILED
    with pytest.raises(ChunkWriterError, match="cannot prepare: the chunk writer is failed"):
        writer.prepare()
