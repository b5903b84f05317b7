"""The same behaviour on every backend: objects, refs, CAS, reflog, control, gc, fsck."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from snapshots_store import (
    CorruptObjectError,
    InvalidNameError,
    ObjectNotFoundError,
    RefConflictError,
    Repository,
    check_repository,
    collect_garbage,
    open_backend,
)
from snapshots_store.backends import Backend, PrefixedBackend
from snapshots_store.objects import encode, object_key

from .helpers import commit_chain, manifest


def test_backend_conditional_writes(any_url: str) -> None:
    backend: Backend = PrefixedBackend(open_backend(any_url), "raw")
    assert backend.get("k") is None
    v1 = backend.put_if_absent("k", b"one")
    assert v1 is not None
    assert backend.put_if_absent("k", b"two") is None
    assert backend.put_if_match("k", b"two", "stale") is None
    v2 = backend.put_if_match("k", b"two", v1)
    assert v2 is not None and v2 != v1
    assert backend.put_if_match("k", b"three", v1) is None
    assert backend.put_if_match("missing", b"x", v2) is None
    blob = backend.get("k")
    assert blob is not None and (blob.data, blob.version) == (b"two", v2)
    info = backend.stat("k")
    assert info is not None and info.size == 3
    assert backend.stat("nope") is None
    backend.put("dir/a", b"a")
    backend.put("dir/b", b"bb")
    assert sorted((i.key, i.size) for i in backend.list("dir/")) == [("dir/a", 1), ("dir/b", 2)]
    backend.delete("dir/a")
    backend.delete("dir/a")
    assert [i.key for i in backend.list("dir/")] == ["dir/b"]


def test_objects_round_trip_and_verify(any_repo: Repository) -> None:
    oid = any_repo.put_object("chunk", b"state" * 1000)
    assert any_repo.put_object("chunk", b"state" * 1000) == oid
    assert any_repo.get_object(oid) == b"state" * 1000
    assert any_repo.has_object(oid)
    with pytest.raises(ObjectNotFoundError):
        any_repo.get_object("0" * 64)
    bad = encode("chunk", b"other")
    any_repo.backend.put(object_key(oid), bad)
    with pytest.raises(CorruptObjectError, match=oid):
        any_repo.get_object(oid)


def test_commit_cas_and_reflog(any_repo: Repository) -> None:
    a, b, c = commit_chain(any_repo, 3)
    assert any_repo.read_ref("heads/main").target == c  # type: ignore[union-attr]
    with pytest.raises(RefConflictError) as excinfo:
        any_repo.commit(manifest(epoch=5, parents=(b,)), "main", expected_head=b, reason="x")
    assert excinfo.value.actual == c
    any_repo.cas_ref("heads/main", c, a, operation_id="rb", reason="rollback")
    assert [(e.seq, e.old, e.new) for e in any_repo.reflog("heads/main")] == [
        (1, None, a),
        (2, a, b),
        (3, b, c),
        (4, c, a),
    ]
    assert [sid for sid, _ in any_repo.log("main")] == [a]
    assert any_repo.resolve(b[:10]) == b
    assert set(any_repo.list_refs()) == {"heads/main"}


def test_control_documents(any_repo: Repository) -> None:
    v1 = any_repo.write_control("main", {"parallelism": 3}, None)
    with pytest.raises(RefConflictError):
        any_repo.write_control("main", {"parallelism": 4}, None)
    v2 = any_repo.write_control("main", {"parallelism": 4}, v1)
    with pytest.raises(RefConflictError):
        any_repo.write_control("main", {"parallelism": 5}, v1)
    assert any_repo.read_control("main") == ({"parallelism": 4}, v2)


def test_gc_and_fsck(any_repo: Repository) -> None:
    ids = commit_chain(any_repo, 3)
    debris = any_repo.put_object("chunk", b"never committed")
    time.sleep(1.1)  # S3 mtimes have one-second resolution
    report = collect_garbage(
        any_repo, retention=timedelta(days=1), grace=timedelta(0), dry_run=True
    )
    assert [item.object_id for item in report.removed] == [debris]
    assert any_repo.has_object(debris)
    report = collect_garbage(
        any_repo, retention=timedelta(days=1), grace=timedelta(0), dry_run=False
    )
    assert [item.object_id for item in report.removed] == [debris]
    assert not any_repo.has_object(debris)
    assert check_repository(any_repo).ok
    assert [sid for sid, _ in any_repo.log("main")] == ids[::-1]
    chunk = next(iter(any_repo.read_manifest(ids[1]).key_groups.values()))[0]
    any_repo.backend.delete(object_key(chunk))
    problems = check_repository(any_repo).problems
    assert [(p.kind, p.snapshot_id, p.object_id) for p in problems] == [
        ("missing-object", ids[1], chunk)
    ]


def test_a_ref_cannot_also_be_a_directory_of_refs(any_repo: Repository) -> None:
    (a,) = commit_chain(any_repo, 1)
    any_repo.cas_ref("heads/team", None, a, reason="x")
    with pytest.raises(InvalidNameError, match="conflicts with existing ref heads/team"):
        any_repo.cas_ref("heads/team/feature", None, a, reason="x")
    any_repo.cas_ref("tags/rel/1", None, a, reason="x")
    with pytest.raises(InvalidNameError, match="conflicts with existing ref tags/rel/1"):
        any_repo.cas_ref("tags/rel", None, a, reason="x")
    assert set(any_repo.list_refs()) == {"heads/main", "heads/team", "tags/rel/1"}


def test_reflog_pruning(any_url: str) -> None:
    now = [datetime.now(UTC)]
    repo = Repository.open(any_url, "app", clock=lambda: now[0])
    ids = commit_chain(repo, 3)
    now[0] += timedelta(days=2)
    report = collect_garbage(repo, retention=timedelta(days=1), grace=timedelta(hours=1))
    assert report.reflog_entries_pruned == 2 and report.removed == ()
    assert [(e.seq, e.new) for e in repo.reflog("heads/main")] == [(3, ids[2])]
    assert check_repository(repo).ok


def test_repository_pickles_for_spark_executors(any_url: str) -> None:
    import pickle

    repo = Repository.open(any_url, "app")
    ids = commit_chain(repo, 2)
    clone = pickle.loads(pickle.dumps(repo))
    assert clone.read_ref("heads/main") == repo.read_ref("heads/main")
    assert [sid for sid, _ in clone.log("main")] == ids[::-1]
    assert clone.put_object("chunk", b"from an executor") in {
        info.key.replace("objects/", "").replace("/", "") for info in repo.backend.list("objects/")
    }
