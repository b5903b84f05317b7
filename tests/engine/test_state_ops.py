"""State operations on real stores and real engine runs: copy_branch, rehash, transform_state,
new_branch_commit (fork, rollback, rescale), and the engine continuing after each."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from runners.engine import EpochRunner, publish_output, read_output
from runners.engine.keygroups import key_group_of
from runners.engine.state.codec import decode_table
from runners.engine.state.restore import load_key_group
from runners.engine.state_ops import (
    MigrationError,
    StateOperationError,
    load_migration,
    new_branch_commit,
    rehash,
    replay_problem,
    transform_state,
)
from snapshots_store import (
    BranchConflictError,
    RefConflictError,
    RefNotFoundError,
    Repository,
    check_repository,
)
from snapshots_store.branch_copy import copy_branch, reachable_objects
from tests.engine.jobs import aggregate_job, running_total, running_total_v2

pytestmark = pytest.mark.spark

STAMP = "2026-12-01T10:00:00.000000Z"


def _frame(table: pa.Table, columns: list[str] | None = None) -> pd.DataFrame:
    frame = table.to_pandas().sort_values(["_epoch", "key"]).reset_index(drop=True)
    return frame if columns is None else frame[columns]


def _state(repo: Repository, rev: str) -> pd.DataFrame:
    """Every key's state (internal columns dropped); asserts each key sits in its key group."""
    manifest = repo.read_manifest(repo.resolve(rev))
    frames = []
    for kg, chain in manifest.key_groups.items():
        table = load_key_group(repo, chain, ("key",), use_cache=False).table
        keys = table.column("key").to_pylist()
        assert {key_group_of(k, manifest.max_parallelism) for k in keys} <= {kg}
        frames.append(table.to_pandas())
    return pd.concat(frames).sort_values("key").reset_index(drop=True)


@pytest.fixture(scope="module")
def full(spark: Any, epochs_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Repository:
    """All 6 epochs at p=2, M=128: the run nothing was done to."""
    repo = Repository.open(f"file://{tmp_path_factory.mktemp('full')}/store", "full")
    assert len(EpochRunner(spark, aggregate_job(epochs_dir), repo=repo).run()) == 6
    return repo


@pytest.fixture(scope="module")
def half(spark: Any, epochs_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Repository:
    """The first 3 epochs; tests branch off `main` and never move it."""
    repo = Repository.open(f"file://{tmp_path_factory.mktemp('half')}/store", "half")
    assert len(EpochRunner(spark, aggregate_job(epochs_dir), repo=repo).run(max_epochs=3)) == 3
    return repo


def _branch_at(repo: Repository, branch: str, rev: str) -> str:
    target = repo.resolve(rev)
    repo.cas_ref(f"heads/{branch}", None, target, reason="test setup")
    return target


# -- rehash --------------------------------------------------------------------------------


def test_rehash_128_to_64_then_continue_equals_a_run_that_never_rehashed(
    spark: Any, full: Repository, half: Repository, epochs_dir: str
) -> None:
    head = _branch_at(half, "rh", "main")
    new = rehash(half, head, 64, branch="rh", operation_id="op-rh", reason="smaller M")
    m = half.read_manifest(new)
    assert (m.kind, m.parents, m.max_parallelism, m.parallelism) == ("migration", (head,), 64, 2)
    assert m.operation_id == "op-rh" and m.outputs == () and m.epoch == 3
    assert m.offsets == half.read_manifest(head).offsets
    assert m.provenance["from_max_parallelism"] == "128"
    assert m.provenance["to_max_parallelism"] == "64"
    assert m.provenance["source_snapshot"] == head
    assert all(len(chain) == 1 for chain in m.key_groups.values())
    pd.testing.assert_frame_equal(_state(half, new), _state(half, head))  # same keys, same values
    # a re-run (e.g. a Celery retry after the CAS) returns the same commit, writes nothing
    again = rehash(half, head, 64, branch="rh", operation_id="op-rh", reason="smaller M")
    assert again == new and len(half.reflog("heads/rh")) == 2
    assert read_output(half, "rh").num_rows == read_output(half, "main").num_rows
    # the engine continues with M=64 (and a live rescale to 3: the shuffle path)
    runner = EpochRunner(spark, aggregate_job(epochs_dir), repo=half, branch="rh", parallelism=3)
    assert [r.epoch for r in runner.run()] == [4, 5, 6]
    rh_head = half.read_manifest(half.resolve("rh"))
    assert rh_head.max_parallelism == 64 and rh_head.kind == "epoch"
    assert half.read_manifest(half.resolve("rh~2")).kind == "rescale"  # epoch 4: p 2 -> 3
    pd.testing.assert_frame_equal(
        _frame(read_output(half, "rh")), _frame(read_output(full, "main"))
    )
    pd.testing.assert_frame_equal(_state(half, "rh"), _state(full, "main"))
    # the branch has moved on: rehashing the old snapshot onto it again is refused
    with pytest.raises(BranchConflictError) as err:
        rehash(half, head, 32, branch="rh", operation_id="op-2", reason="again")
    assert "stop the job" in str(err.value) and isinstance(err.value, RefConflictError)


# -- transform_state -----------------------------------------------------------------------


def test_transform_state_by_reference_then_continue(
    spark: Any, full: Repository, half: Repository, epochs_dir: str
) -> None:
    head = _branch_at(half, "noted", "main")
    new = transform_state(
        half, head, "add-note", branch="noted", operation_id="op-t",
        reason="add a column", created_at=STAMP,
    )  # fmt: skip
    m = half.read_manifest(new)
    assert (m.kind, m.parents, m.max_parallelism) == ("migration", (head,), 128)
    assert m.created_at == STAMP
    assert m.provenance["function"] == "add-note"
    assert set(m.key_groups) == set(half.read_manifest(head).key_groups)
    state = _state(half, new)
    assert set(state["note"]) == {"migrated"}
    pd.testing.assert_frame_equal(state.drop(columns=["note"]), _state(half, head))
    again = transform_state(
        half, head, "add-note", branch="noted", operation_id="op-t",
        reason="add a column",
    )  # fmt: skip
    assert again == new
    # the aggregate job keeps its own columns: the extra one is dropped where keys change
    EpochRunner(spark, aggregate_job(epochs_dir), repo=half, branch="noted").run()
    pd.testing.assert_frame_equal(
        _frame(read_output(half, "noted")), _frame(read_output(full, "main"))
    )
    # read back from the store (base with the column + deltas without it) = the state the
    # epochs held in memory
    noted = _state(half, "noted").drop(columns=["note"], errors="ignore")
    pd.testing.assert_frame_equal(noted, _state(full, "main"))


def test_transform_state_renames_a_per_key_state_for_a_new_code_version(
    spark: Any, epochs_dir: str, tmp_path: Path
) -> None:
    repo = Repository.open(f"file://{tmp_path}/store", "perkey")
    v1 = aggregate_job(epochs_dir, aggregate=None, process=running_total)
    EpochRunner(spark, v1, repo=repo).run(max_epochs=2)
    before = _frame(read_output(repo, "main"))
    head = repo.resolve("main")
    new = transform_state(
        repo, head, "rename-sum-to-total", branch="main",
        operation_id="op-v2", reason="state sum is now total",
    )  # fmt: skip
    assert repo.resolve("main") == new
    v2 = aggregate_job(epochs_dir, aggregate=None, process=running_total_v2, code_version="2")
    EpochRunner(spark, v2, repo=repo).run(max_epochs=2)
    reference = Repository.open(f"file://{tmp_path}/ref", "perkey")
    EpochRunner(spark, v1, repo=reference).run(max_epochs=4)
    cols = ["_epoch", "key", "count", "sum_value", "max_value"]
    pd.testing.assert_frame_equal(
        _frame(read_output(repo, "main"), cols), _frame(read_output(reference, "main"), cols)
    )
    assert len(before) < read_output(repo, "main").num_rows


def test_transform_state_refuses_results_that_break_keys(half: Repository) -> None:
    head = _branch_at(half, "bad", "main")

    def drop_key(t: pa.Table) -> pa.Table:
        return t.drop_columns(["key"])

    def rename_keys(t: pa.Table) -> pa.Table:
        keys = pa.array([k + "-x" for k in t.column("key").to_pylist()])
        return t.set_column(0, "key", keys)

    def duplicate(t: pa.Table) -> pa.Table:
        return pa.concat_tables([t, t.slice(0, 1)])

    def boom(t: pa.Table) -> pa.Table:
        raise KeyError("sum_value")

    first = min(half.read_manifest(head).key_groups)
    cases = [
        (drop_key, "lacks key column(s) ['key']"),
        (rename_keys, "no longer belong to key group"),
        (duplicate, "lists a key more than once"),
        (lambda t: t.to_pandas(), "not a pyarrow.Table"),
        (boom, "failed on key group"),
    ]
    for fn, message in cases:
        with pytest.raises(MigrationError) as err:
            transform_state(half, head, fn, branch="bad", operation_id=None, reason="test")
        assert message in str(err.value)
        assert f"key group {first}" in str(err.value)
    assert half.resolve("bad") == head  # nothing committed


def test_load_migration_errors_say_what_is_wrong() -> None:
    assert load_migration("add-note").__name__ == "add_note"
    cases = {
        "tests.engine.jobs:add_note": "a module:attr reference is not accepted",
        "no-such-migration": "no state migration named 'no-such-migration' is installed",
        "broken-migration": "has no attribute 'no_such_function'",
        "not-a-function": "is a str, not a function",
    }
    for ref, message in cases.items():
        with pytest.raises(MigrationError) as err:
            load_migration(ref)
        assert message in str(err.value) and ref in str(err.value)


def test_snapshot_without_recorded_key_needs_key_argument(half: Repository) -> None:
    head = half.read_manifest(half.resolve("main"))
    old_style = head.with_changes(extra={"job": "clicks"}, branch="oldstyle")
    sid = half.commit(old_style, "oldstyle", expected_head=None, reason="test")
    with pytest.raises(StateOperationError, match="pass key="):
        rehash(half, sid, 64, branch="oldstyle", operation_id=None, reason="t")
    new = rehash(half, sid, 64, branch="oldstyle", operation_id=None, reason="t", key="key")
    assert half.read_manifest(new).extra["key"] == ["key"]


# -- new_branch_commit -----------------------------------------------------------------------


def test_fork_rollback_and_rescale_commits_keep_outputs_counted_once(
    spark: Any, full: Repository, half: Repository, epochs_dir: str, tmp_path: Path
) -> None:
    source = half.resolve("main~1")  # epoch 2
    kwargs: dict[str, Any] = {
        "kind": "fork",
        "operation_id": "op-fork",
        "provenance": {"requested_by": "alice", "reason": "try v2"},
        "code_version": "2",
    }
    fork = new_branch_commit(half, source, "fk", created_at=STAMP, **kwargs)
    assert new_branch_commit(half, source, "fk", created_at=STAMP, **kwargs) == fork
    assert new_branch_commit(half, source, "fk", **kwargs) == fork  # a retry without the stamp
    m = half.read_manifest(fork)
    assert (m.kind, m.parents, m.epoch, m.outputs, m.code_version) == (
        "fork", (source,), 2, (), "2",
    )  # fmt: skip
    assert m.provenance == {"requested_by": "alice", "reason": "try v2", "source_snapshot": source}
    assert m.key_groups == half.read_manifest(source).key_groups
    main_out = _frame(read_output(half, "main"))
    pd.testing.assert_frame_equal(
        _frame(read_output(half, "fk")), main_out[main_out["_epoch"] <= 2].reset_index(drop=True)
    )
    with pytest.raises(BranchConflictError, match="already exists"):
        new_branch_commit(half, source, "fk", **{**kwargs, "operation_id": "op-other"})
    runner = EpochRunner(spark, aggregate_job(epochs_dir), repo=half, branch="fk")
    assert [r.epoch for r in runner.run()] == [3, 4, 5, 6]
    full_out = _frame(read_output(full, "main"))
    pd.testing.assert_frame_equal(_frame(read_output(half, "fk")), full_out)
    db = sqlite3.connect(str(tmp_path / "sink.db"))
    assert publish_output(half, "fk", db, "out") == len(full_out)
    # rollback to epoch 3: later epochs leave the branch's output, a re-run brings them back
    head = half.resolve("fk")
    back = new_branch_commit(
        half, "fk~3", "fk", kind="rollback", operation_id="op-rb",
        provenance={"reason": "bad deploy"}, expected_head=head,
    )  # fmt: skip
    assert half.read_manifest(back).epoch == 3
    assert set(read_output(half, "fk").column("_epoch").to_pylist()) == {1, 2, 3}
    publish_output(half, "fk", db, "out")
    rows = db.execute("SELECT count(*) FROM out WHERE branch = 'fk'").fetchone()[0]
    assert rows == read_output(half, "fk").num_rows  # the fork commit wiped nothing
    # a rescale commit at p=3 (a rescale with restart), then the job runs on at p=3
    scaled = new_branch_commit(
        half, back, "fk", kind="rescale", operation_id="op-rs", provenance={},
        expected_head=back, parallelism=3,
    )  # fmt: skip
    assert half.read_manifest(scaled).parallelism == 3
    EpochRunner(spark, aggregate_job(epochs_dir), repo=half, branch="fk", parallelism=3).run()
    pd.testing.assert_frame_equal(_frame(read_output(half, "fk")), full_out)
    publish_output(half, "fk", db, "out")
    rows = db.execute("SELECT count(*) FROM out WHERE branch = 'fk'").fetchone()[0]
    assert rows == len(full_out)
    with pytest.raises(ValueError, match="kind must be one of"):
        new_branch_commit(half, back, "x", kind="epoch", operation_id=None, provenance={})


# -- copy_branch ---------------------------------------------------------------------------


class _Crash(Exception):
    pass


def test_copy_branch_resumes_after_a_crash_and_fast_forwards(
    half: Repository, tmp_path: Path
) -> None:
    head = _branch_at(half, "cp", "main")
    dst = Repository.open(f"file://{tmp_path}/other-store", "moved")
    manifests, data = reachable_objects(half, head)
    total = len(manifests) + len(data)
    assert len(manifests) == 3

    def crash_at_half(done: int, of: int) -> None:
        assert of == total
        if done == total // 2:
            raise _Crash

    with pytest.raises(_Crash):
        copy_branch(half, dst, "cp", progress=crash_at_half)
    assert dst.read_ref("heads/cp") is None
    seen: list[int] = []
    result = copy_branch(
        half, dst, "cp", progress=lambda d, _: seen.append(d), operation_id="op-copy"
    )
    assert seen == list(range(1, total + 1))
    assert result.snapshot_id == head and result.ref_moved and result.previous_target is None
    assert result.objects_skipped == total // 2 and result.objects_copied == total - total // 2
    assert result.bytes_copied > 0 and result.bytes_skipped > 0
    assert dst.resolve("cp") == head
    assert dst.reflog("heads/cp")[-1].operation_id == "op-copy"
    assert check_repository(dst).ok
    pd.testing.assert_frame_equal(_frame(read_output(dst, "cp")), _frame(read_output(half, "cp")))
    pd.testing.assert_frame_equal(_state(dst, "cp"), _state(half, "cp"))
    again = copy_branch(half, dst, "cp", verify_existing=True)
    assert (again.objects_copied, again.objects_skipped, again.ref_moved) == (0, total, False)
    # the source moves on: the copy fast-forwards and copies just the new manifest
    savepoint = new_branch_commit(
        half, head, "cp", kind="savepoint", operation_id="op-sp", provenance={},
        expected_head=head,
    )  # fmt: skip
    more = copy_branch(half, dst, "cp")
    assert (more.objects_copied, more.previous_target, dst.resolve("cp")) == (1, head, savepoint)
    # the destination diverged: refused unless forced
    other = new_branch_commit(
        dst, head, "cp", kind="fork", operation_id="op-elsewhere", provenance={},
        expected_head=savepoint,
    )  # fmt: skip
    new_branch_commit(
        half, savepoint, "cp", kind="savepoint", operation_id="op-sp2", provenance={},
        expected_head=savepoint,
    )  # fmt: skip
    with pytest.raises(BranchConflictError, match="not in the history"):
        copy_branch(half, dst, "cp")
    assert dst.resolve("cp") == other
    forced = copy_branch(half, dst, "cp", force=True)
    assert dst.resolve("cp") == half.resolve("cp") and forced.previous_target == other
    with pytest.raises(RefNotFoundError, match="does not exist"):
        copy_branch(half, dst, "no-such-branch")


def test_copy_refuses_a_corrupt_source_object(half: Repository, tmp_path: Path) -> None:
    from snapshots_store import CorruptObjectError
    from snapshots_store.objects import object_key

    head = _branch_at(half, "cp-bad", "main")
    _, data = reachable_objects(half, head)
    victim = data[0]
    key = object_key(victim)
    blob = half.backend.get(key)
    assert blob is not None
    try:
        half.backend.put(key, blob.data[:-3] + b"xyz")
        dst = Repository.open(f"file://{tmp_path}/d", "moved")
        with pytest.raises(CorruptObjectError):
            copy_branch(half, dst, "cp-bad")
        assert not dst.has_object(victim) and dst.read_ref("heads/cp-bad") is None
    finally:
        half.backend.put(key, blob.data)
    chains = [c for _, m in half.log(head) for c in m.key_groups.values()]
    ref = next(r for chain in chains for r in chain if r.split(":")[0] == victim)
    assert decode_table(half.read_chunk(ref)).num_rows > 0  # sound again: a pack member


def test_replay_problem_checks_the_source_of_a_snapshot(half: Repository, epochs_dir: str) -> None:
    job = aggregate_job(epochs_dir)
    assert replay_problem(job.source, half.read_manifest(half.resolve("main"))) is None
