"""Replication of a namespace into another store (the copy migration's store primitive)."""

from __future__ import annotations

from pathlib import Path

import pytest

from snapshots_store import Repository, StoreError
from snapshots_store.objects import object_key
from snapshots_store.replicate import replicate
from tests.store.helpers import commit_chain, listing


def _history(repo: Repository) -> dict[str, object]:
    refs = repo.list_refs()
    return {
        "refs": {name: ref.target for name, ref in refs.items()},
        "reflogs": {name: repo.reflog(name) for name in refs},
        "control": repo.read_control("main")[0],
    }


def test_replica_has_the_same_history_and_goes_on_from_it(repo: Repository, tmp_path: Path) -> None:
    ids = commit_chain(repo, 6)
    repo.cas_ref("tags/keep", None, ids[2], reason="savepoint")
    side = commit_chain(repo, 2, branch="side")
    repo.write_control("main", {"parallelism": 3}, None)
    garbage = repo.put_object("chunk", b"unreferenced")
    dst = Repository.open(f"file://{tmp_path / 'second'}", "ns")
    seen: list[tuple[int, int]] = []

    report = replicate(repo, dst, progress=lambda done, total: seen.append((done, total)))

    assert _history(dst) == _history(repo)
    assert [sid for sid, _ in dst.log("main")] == list(reversed(ids))
    assert dst.read_ref("heads/side").target == side[-1]
    assert not dst.has_object(garbage)  # only what refs and reflogs reach
    assert report.objects_copied > 0 and report.objects_present == 0
    assert seen[-1][0] == seen[-1][1]
    # the replica continues the same reflog: the next move is number 7 on both
    m = dst.read_manifest(ids[-1]).with_changes(parents=(ids[-1],), epoch=6)
    dst.commit(m, "main", expected_head=ids[-1], reason="epoch 6")
    assert dst.reflog("heads/main")[-1].seq == repo.reflog("heads/main")[-1].seq + 1


def test_replication_is_idempotent_and_resumes(repo: Repository, tmp_path: Path) -> None:
    commit_chain(repo, 4)
    root = tmp_path / "second"
    dst = Repository.open(f"file://{root}", "ns")
    first = replicate(repo, dst)
    before = listing(root)
    again = replicate(repo, dst)
    assert again.objects_copied == 0 and again.objects_present == first.objects_copied
    assert {k: v for k, v in listing(root).items() if "lock" not in k} == {
        k: v for k, v in before.items() if "lock" not in k
    }


def test_a_corrupt_source_object_stops_replication_before_any_ref(
    repo: Repository, local_root: Path, tmp_path: Path
) -> None:
    ids = commit_chain(repo, 3)
    chunk = next(iter(repo.read_manifest(ids[0]).key_groups.values()))[0]
    path = local_root / "app" / object_key(chunk)
    path.write_bytes(path.read_bytes()[:-3] + b"xyz")
    dst = Repository.open(f"file://{tmp_path / 'second'}", "ns")
    with pytest.raises(StoreError):
        replicate(repo, dst)
    assert dst.list_refs() == {}


def test_a_diverged_destination_is_refused(repo: Repository, tmp_path: Path) -> None:
    commit_chain(repo, 2)
    dst = Repository.open(f"file://{tmp_path / 'second'}", "ns")
    commit_chain(dst, 3)
    with pytest.raises(StoreError, match="different content"):
        replicate(repo, dst)
