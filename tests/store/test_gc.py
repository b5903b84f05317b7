"""gc: reachability from refs, tags and recent reflog entries; grace period; dry run."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from snapshots_store import Repository, StoreError, check_repository, collect_garbage
from snapshots_store.backends import KeyInfo, PrefixedBackend, open_backend
from snapshots_store.objects import object_key

from .helpers import commit_chain, listing, manifest

LOGS = "logs/refs/heads/main"


def commit_chain_from(repo: Repository, head: str, n: int) -> list[str]:
    """n more commits on main after `head`."""
    ids = []
    epoch = repo.read_manifest(head).epoch
    for i in range(n):
        m = manifest(epoch=epoch + i + 1, parents=(head,))
        head = repo.commit(m, "main", expected_head=head, reason="more")
        ids.append(head)
    return ids


class Clock:
    """A settable clock for the repository (reflog times, gc's notion of now)."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


def _objects_of(repo: Repository, snapshot_id: str) -> set[str]:
    m = repo.read_manifest(snapshot_id)
    return {snapshot_id, *m.outputs, *(c for chunks in m.key_groups.values() for c in chunks)}


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def timed_repo(store_url: str, clock: Clock) -> Repository:
    return Repository.open(store_url, "app", clock=clock)


def test_rolled_back_commits_live_until_reflog_retention_expires(
    timed_repo: Repository, clock: Clock
) -> None:
    repo = timed_repo
    ids = commit_chain(repo, 4)
    repo.cas_ref("heads/main", ids[3], ids[1], operation_id="rb", reason="rollback")
    abandoned = _objects_of(repo, ids[2]) | _objects_of(repo, ids[3])
    clock.now += timedelta(hours=12)
    report = collect_garbage(repo, retention=timedelta(days=1), grace=timedelta(0))
    assert report.removed == ()
    assert all(repo.has_object(o) for o in abandoned)
    clock.now += timedelta(days=2)
    report = collect_garbage(repo, retention=timedelta(days=1), grace=timedelta(0))
    assert {item.object_id for item in report.removed} == abandoned
    assert not any(repo.has_object(o) for o in abandoned)
    assert check_repository(repo).ok
    assert [sid for sid, _ in repo.log("main")] == [ids[1], ids[0]]


def test_tags_protect_commits_beyond_retention(timed_repo: Repository, clock: Clock) -> None:
    repo = timed_repo
    ids = commit_chain(repo, 3)
    repo.cas_ref("tags/savepoint-1", None, ids[2], reason="savepoint")
    repo.cas_ref("heads/main", ids[2], ids[0], reason="rollback")
    clock.now += timedelta(days=30)
    report = collect_garbage(repo, retention=timedelta(days=1), grace=timedelta(0))
    assert report.removed == ()
    assert check_repository(repo).ok
    assert repo.ancestors("tags/savepoint-1") == set(ids)


def test_deleted_branch_is_kept_by_its_reflog_until_retention(
    timed_repo: Repository, clock: Clock
) -> None:
    repo = timed_repo
    base = commit_chain(repo, 1)[0]
    fork = repo.commit(
        manifest(branch="side", epoch=1, parents=(base,)),
        "side",
        expected_head=None,
        reason="fork",
    )
    repo.delete_ref("heads/side", fork, operation_id="op-del", reason="delete branch")
    assert collect_garbage(repo, retention=timedelta(days=1), grace=timedelta(0)).removed == ()
    clock.now += timedelta(days=2)
    report = collect_garbage(repo, retention=timedelta(days=1), grace=timedelta(0))
    assert [item.object_id for item in report.removed] == [fork]


def test_grace_period_protects_young_unreachable_objects(
    timed_repo: Repository, clock: Clock
) -> None:
    repo = timed_repo
    commit_chain(repo, 2)
    in_flight = repo.put_object("chunk", b"chunk of a commit not yet made")
    report = collect_garbage(repo, retention=timedelta(0), grace=timedelta(hours=1))
    assert report.removed == () and report.kept_young == 1
    clock.now += timedelta(hours=2)
    report = collect_garbage(repo, retention=timedelta(0), grace=timedelta(hours=1))
    assert [item.object_id for item in report.removed] == [in_flight]


def test_objects_written_after_gc_started_are_never_removed(repo: Repository) -> None:
    commit_chain(repo, 1)
    time.sleep(1.1)
    late = repo.put_object("chunk", b"written after the gc clock started")
    started = datetime.now(UTC) - timedelta(milliseconds=1)
    repo_at_start = Repository(repo.backend, clock=lambda: started)
    report = collect_garbage(repo_at_start, retention=timedelta(0), grace=timedelta(0))
    assert report.removed == ()
    assert repo.has_object(late)


def test_dry_run_lists_with_sizes_and_removes_nothing(
    timed_repo: Repository, clock: Clock, local_root: object
) -> None:
    repo = timed_repo
    commit_chain(repo, 2)
    junk = [repo.put_object("blob", bytes(200 + i)) for i in range(3)]
    clock.now += timedelta(days=1)
    before = listing(local_root)  # type: ignore[arg-type]
    report = collect_garbage(repo, retention=timedelta(0), grace=timedelta(hours=1), dry_run=True)
    assert report.dry_run
    assert sorted(item.object_id for item in report.removed) == sorted(junk)  # type: ignore[type-var]
    for item in report.removed:
        info = repo.backend.stat(object_key(item.object_id))  # type: ignore[arg-type]
        assert info is not None and item.size == info.size > 0
    assert report.removed_bytes == sum(item.size for item in report.removed)
    assert listing(local_root) == before  # type: ignore[arg-type]


def test_gc_refuses_to_delete_when_a_reachable_manifest_is_missing(
    timed_repo: Repository, clock: Clock, local_root: object
) -> None:
    repo = timed_repo
    ids = commit_chain(repo, 3)
    repo.put_object("chunk", b"junk")
    repo.backend.delete(object_key(ids[1]))
    clock.now += timedelta(days=1)
    before = listing(local_root)  # type: ignore[arg-type]
    cold = Repository(repo.backend, clock=clock)  # no manifests cached from the commits
    with pytest.raises(StoreError, match=f"gc stopped before deleting anything.*{ids[1]}"):
        collect_garbage(cold, retention=timedelta(0), grace=timedelta(0))
    assert listing(local_root) == before  # type: ignore[arg-type]


def test_gc_keeps_other_namespaces_alone(store_url: str, clock: Clock) -> None:
    a = Repository.open(store_url, "app-a", clock=clock)
    b = Repository.open(store_url, "app-b", clock=clock)
    commit_chain(a, 2)
    kept = commit_chain(b, 2)
    clock.now += timedelta(days=10)
    collect_garbage(a, retention=timedelta(0), grace=timedelta(0))
    assert all(b.has_object(s) for s in kept)
    assert check_repository(b).ok


def test_negative_durations_are_rejected(repo: Repository) -> None:
    with pytest.raises(ValueError):
        collect_garbage(repo, retention=timedelta(seconds=-1), grace=timedelta(0))


def test_gc_after_a_shorter_retention_run_is_not_blocked(
    timed_repo: Repository, clock: Clock
) -> None:
    repo = timed_repo
    ids = commit_chain(repo, 3)
    repo.cas_ref("heads/main", ids[2], ids[0], reason="rollback")
    clock.now += timedelta(hours=1)
    first = collect_garbage(repo, retention=timedelta(0), grace=timedelta(0))
    assert {ids[1], ids[2]} <= {item.object_id for item in first.removed}
    cold = Repository(repo.backend, clock=clock)
    report = collect_garbage(cold, retention=timedelta(days=7), grace=timedelta(0))
    # The first run pruned the expired entries 1..3; the current entry (4: ids[2] -> ids[0])
    # is never pruned and still names the removed ids[2].
    assert report.reflog_roots_gone == 1 and report.removed == ()
    assert check_repository(cold).ok


class _StaleListingBackend(PrefixedBackend):
    """Lists every object as a day old, as a listing taken before a writer refreshed it."""

    def list(self, prefix: str) -> Iterator[KeyInfo]:
        for info in super().list(prefix):
            yield KeyInfo(info.key, info.size, info.mtime - timedelta(days=1))


def test_object_refreshed_after_the_listing_is_not_removed(store_url: str) -> None:
    repo = Repository(_StaleListingBackend(open_backend(store_url), "app"))
    commit_chain(repo, 1)
    reused = repo.put_object("chunk", b"re-used by an in-flight commit")
    report = collect_garbage(repo, retention=timedelta(0), grace=timedelta(hours=1))
    assert report.removed == () and report.kept_young == 1
    assert repo.has_object(reused)


def test_gc_prunes_expired_reflog_entries_as_a_prefix(timed_repo: Repository, clock: Clock) -> None:
    repo = timed_repo
    ids = commit_chain(repo, 3)  # entries 1..3 at t0
    clock.now += timedelta(days=3)
    ids += commit_chain_from(repo, ids[-1], 2)  # entries 4..5 at t0 + 3 days
    dry = collect_garbage(repo, retention=timedelta(days=1), grace=timedelta(0), dry_run=True)
    assert dry.reflog_entries_pruned == 3
    assert [e.seq for e in repo.reflog("heads/main")] == [1, 2, 3, 4, 5]
    report = collect_garbage(repo, retention=timedelta(days=1), grace=timedelta(0))
    assert report.reflog_entries_pruned == 3 and report.removed == ()
    assert [e.seq for e in repo.reflog("heads/main")] == [4, 5]
    assert check_repository(repo).ok
    clock.now += timedelta(days=3)
    collect_garbage(repo, retention=timedelta(days=1), grace=timedelta(0))
    assert [e.seq for e in repo.reflog("heads/main")] == [5]  # the current entry stays
    more = commit_chain_from(repo, ids[-1], 1)
    assert [(e.seq, e.new) for e in repo.reflog("heads/main")] == [(5, ids[-1]), (6, more[0])]
    assert check_repository(repo).ok


def test_pruning_stops_at_the_first_entry_within_retention(
    timed_repo: Repository, clock: Clock
) -> None:
    repo = timed_repo
    ids = commit_chain(repo, 2)  # 1..2 at t0
    clock.now += timedelta(days=3)
    repo.cas_ref("tags/keep", None, ids[0], reason="tag")
    ids += commit_chain_from(repo, ids[-1], 1)  # 3 at t0 + 3 d
    report = collect_garbage(repo, retention=timedelta(days=1), grace=timedelta(0))
    assert report.reflog_entries_pruned == 2
    assert [e.seq for e in repo.reflog("heads/main")] == [3]
    assert [e.seq for e in repo.reflog("tags/keep")] == [1]


def test_interrupted_pruning_leaves_no_visible_hole(timed_repo: Repository, clock: Clock) -> None:
    repo = timed_repo
    commit_chain(repo, 4)
    clock.now += timedelta(days=3)
    # A gc that raised the mark to 3 and died before deleting entries 1..2:
    repo.backend.put(f"{LOGS}/pruned-before", b'{"pruned_before":3}')
    assert [e.seq for e in repo.reflog("heads/main")] == [3, 4]
    assert check_repository(repo).ok
    report = collect_garbage(repo, retention=timedelta(days=1), grace=timedelta(0))
    assert report.reflog_entries_pruned == 1  # entry 3; leftovers 1..2 are deleted too
    assert sorted(i.key for i in repo.backend.list(f"{LOGS}/")) == [
        f"{LOGS}/000000000004",
        f"{LOGS}/pruned-before",
    ]
    assert [e.seq for e in repo.reflog("heads/main")] == [4]


def test_a_hole_above_the_pruning_mark_is_still_a_gap(timed_repo: Repository, clock: Clock) -> None:
    repo = timed_repo
    commit_chain(repo, 5)
    repo.backend.put(f"{LOGS}/pruned-before", b'{"pruned_before":2}')
    repo.backend.delete(f"{LOGS}/000000000003")
    assert [p.kind for p in check_repository(repo).problems] == ["reflog-gap"]
    with pytest.raises(StoreError, match="lacks entries"):
        repo.reflog("heads/main")
