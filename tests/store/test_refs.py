"""Refs: CAS semantics, reflog, name validation before I/O, revision resolution."""

from __future__ import annotations

from pathlib import Path

import pytest

from snapshots_store import (
    InvalidNameError,
    MalformedManifestError,
    ObjectNotFoundError,
    RefConflictError,
    RefNotFoundError,
    Repository,
    UnknownRevisionError,
)
from snapshots_store.backends import Backend, PrefixedBackend, open_backend
from snapshots_store.names import check_branch_name

from .helpers import commit_chain, listing, manifest

BAD_NAMES = [
    "../x",
    "/etc",
    "a/../../b",
    "x.lock",
    "a/x.lock/b",
    "",
    "a\0b",
    "a//b",
    "a/",
    ".hidden",
    "-dash",
    "a b",
    "a..b",
    "ä",
    "a" * 101,
    "main\n",
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_branch_names_are_rejected_before_any_io(
    repo: Repository, local_root: Path, name: str
) -> None:
    ids = commit_chain(repo, 1)
    before = listing(local_root)
    with pytest.raises(InvalidNameError) as excinfo:
        repo.cas_ref(f"heads/{name}", None, ids[0], reason="bad")
    assert repr(f"heads/{name}") in str(excinfo.value) or repr(name) in str(excinfo.value)
    with pytest.raises(InvalidNameError):
        repo.commit(manifest(), name, expected_head=None, reason="bad")
    with pytest.raises(InvalidNameError):
        repo.write_control(name, {}, None)
    with pytest.raises((InvalidNameError, UnknownRevisionError)):
        repo.read_ref(f"tags/{name}")
    assert listing(local_root) == before


@pytest.mark.parametrize("name", ["main", "release/2026-01", "a.b_c-d", "A9", "x" * 100])
def test_good_names_are_accepted(name: str) -> None:
    assert check_branch_name(name) == name


@pytest.mark.parametrize("name", ["main", "refs", "refs/main", "branches/x", "heads"])
def test_ref_names_need_heads_or_tags(repo: Repository, name: str) -> None:
    with pytest.raises(InvalidNameError, match="heads/<branch> or tags/<tag>"):
        repo.read_ref(name)


@pytest.mark.parametrize("namespace", ["../x", "a/b", "", ".x"])
def test_bad_namespaces_are_rejected(store_url: str, namespace: str) -> None:
    with pytest.raises(InvalidNameError):
        Repository.open(store_url, namespace)


def test_open_creates_nothing_until_first_write(local_root: Path, store_url: str) -> None:
    repo = Repository.open(store_url, "app")
    assert repo.list_refs() == {}
    assert repo.read_ref("heads/main") is None
    assert not local_root.exists()


def test_cas_create_update_and_stale_expected(repo: Repository, local_root: Path) -> None:
    a, b, c = commit_chain(repo, 3, branch="side")
    assert repo.cas_ref("heads/main", None, a, reason="create").seq == 1
    assert repo.cas_ref("heads/main", a, b, operation_id="op-2", reason="move").seq == 2
    before = listing(local_root)
    with pytest.raises(RefConflictError) as excinfo:
        repo.cas_ref("heads/main", a, c, reason="stale")
    assert (excinfo.value.expected, excinfo.value.actual) == (a, b)
    with pytest.raises(RefConflictError):
        repo.cas_ref("heads/main", None, c, reason="must not exist")
    assert listing(local_root) == before
    assert repo.read_ref("refs/heads/main") == repo.read_ref("heads/main")
    assert repo.read_ref("heads/main").target == b  # type: ignore[union-attr]


def test_cas_to_a_missing_or_non_manifest_object_is_refused(
    repo: Repository, local_root: Path
) -> None:
    chunk = repo.put_object("chunk", b"x")
    before = listing(local_root)
    with pytest.raises(ObjectNotFoundError):
        repo.cas_ref("heads/main", None, "e" * 64, reason="dangling")
    with pytest.raises(Exception, match="not a manifest"):
        repo.cas_ref("heads/main", None, chunk, reason="chunk")
    assert listing(local_root) == before


def test_commit_with_stale_expected_head_changes_no_ref(repo: Repository) -> None:
    a, b = commit_chain(repo, 2)
    with pytest.raises(RefConflictError):
        repo.commit(manifest(epoch=9, parents=(a,)), "main", expected_head=a, reason="stale writer")
    assert repo.read_ref("heads/main").target == b  # type: ignore[union-attr]
    assert [e.new for e in repo.reflog("heads/main")] == [a, b]


def test_commit_refuses_missing_parent_and_foreign_branch(repo: Repository) -> None:
    with pytest.raises(ObjectNotFoundError, match="parent"):
        repo.commit(manifest(parents=("d" * 64,)), "main", expected_head=None, reason="x")
    with pytest.raises(Exception, match="branch"):
        repo.commit(manifest(branch="other"), "main", expected_head=None, reason="x")
    assert repo.list_refs() == {}


def test_reflog_records_every_move_in_order(repo: Repository) -> None:
    ids = commit_chain(repo, 4)
    repo.cas_ref("heads/main", ids[-1], ids[1], operation_id="rb-1", reason="rollback")
    log = repo.reflog("heads/main")
    assert [e.seq for e in log] == [1, 2, 3, 4, 5]
    assert [(e.old, e.new) for e in log] == [
        (None, ids[0]),
        (ids[0], ids[1]),
        (ids[1], ids[2]),
        (ids[2], ids[3]),
        (ids[3], ids[1]),
    ]
    assert log[-1].operation_id == "rb-1" and log[-1].reason == "rollback"


def test_reflog_of_a_ref_is_not_mixed_with_nested_ref_logs(repo: Repository) -> None:
    ids = commit_chain(repo, 2)
    repo.cas_ref("tags/v1", None, ids[0], reason="tag")
    with pytest.raises(InvalidNameError, match="conflicts with existing ref tags/v1"):
        repo.cas_ref("tags/v1/rc", None, ids[1], reason="nested")
    assert len(repo.reflog("tags/v1")) == 1


def test_reflog_is_gap_free_when_the_writer_died_after_its_cas(
    repo: Repository, local_root: Path
) -> None:
    a, b, c = commit_chain(repo, 3)
    # Simulate the writer of move 3 dying right after its CAS: its own log entry is absent.
    (local_root / "app/logs/refs/heads/main/000000000003").unlink()
    assert [e.seq for e in repo.reflog("heads/main")] == [1, 2, 3]
    d = repo.commit(manifest(epoch=7, parents=(c,)), "main", expected_head=c, reason="next")
    assert (local_root / "app/logs/refs/heads/main/000000000003").exists()
    assert [e.new for e in repo.reflog("heads/main")] == [a, b, c, d]


def test_delete_ref_leaves_reflog_and_reuse_continues_sequence(repo: Repository) -> None:
    a, b = commit_chain(repo, 2)
    repo.cas_ref("tags/keep", None, a, reason="tag")
    with pytest.raises(RefConflictError):
        repo.delete_ref("tags/keep", b, reason="wrong expected")
    repo.delete_ref("tags/keep", a, operation_id="ret", reason="retention")
    assert repo.read_ref("tags/keep") is None
    assert "tags/keep" not in repo.list_refs()
    with pytest.raises(RefNotFoundError):
        repo.delete_ref("tags/keep", a, reason="again")
    repo.cas_ref("tags/keep", None, b, reason="recreate")
    assert [(e.seq, e.new) for e in repo.reflog("tags/keep")] == [(1, a), (2, None), (3, b)]


def test_reflog_of_unknown_ref_raises(repo: Repository) -> None:
    with pytest.raises(RefNotFoundError, match="heads/nope"):
        repo.reflog("heads/nope")


def test_list_refs_by_prefix(repo: Repository) -> None:
    a, b = commit_chain(repo, 2)
    repo.cas_ref("heads/feature/x", None, a, reason="fork")
    repo.cas_ref("tags/save-1", None, b, reason="savepoint")
    assert set(repo.list_refs()) == {"heads/main", "heads/feature/x", "tags/save-1"}
    assert set(repo.list_refs("heads/")) == {"heads/main", "heads/feature/x"}
    assert repo.list_refs("tags/") == {"tags/save-1": repo.read_ref("tags/save-1")}


def test_resolve_forms(repo: Repository) -> None:
    a, b, c = commit_chain(repo, 3)
    repo.cas_ref("tags/v1", None, a, reason="tag")
    assert repo.resolve(c) == c
    assert repo.resolve("main") == c
    assert repo.resolve("heads/main") == c
    assert repo.resolve("refs/heads/main") == c
    assert repo.resolve("v1") == a
    assert repo.resolve("tags/v1") == a
    assert repo.resolve(b[:12]) == b
    assert repo.resolve("main~1") == b
    assert repo.resolve("main~2") == a
    assert repo.resolve("main^") == b
    assert repo.resolve("main~1^1") == a


@pytest.mark.parametrize(
    "rev", ["nope", "heads/nope", "f" * 64, "0123", "main~5", "main^2", "", "a\0b", "../x"]
)
def test_unknown_revisions_raise(repo: Repository, rev: str) -> None:
    commit_chain(repo, 3)
    with pytest.raises(UnknownRevisionError):
        repo.resolve(rev)


def test_control_document_cas(repo: Repository) -> None:
    assert repo.read_control("main") == ({}, None)
    v1 = repo.write_control("main", {"parallelism": 4}, None)
    doc, version = repo.read_control("main")
    assert (doc, version) == ({"parallelism": 4}, v1)
    v2 = repo.write_control("main", {"parallelism": 8}, v1)
    with pytest.raises(RefConflictError):
        repo.write_control("main", {"parallelism": 2}, v1)
    with pytest.raises(RefConflictError):
        repo.write_control("main", {"parallelism": 2}, None)
    v3 = repo.write_control("main", {"parallelism": 4}, v2)
    assert v3 not in (v1, v2)  # same content as v1, still a new version (no ABA)
    assert repo.read_control("main") == ({"parallelism": 4}, v3)


def test_commit_retry_after_a_successful_cas_is_idempotent(repo: Repository) -> None:
    a = commit_chain(repo, 1)[0]
    m = manifest(epoch=1, parents=(a,))
    first = repo.commit(m, "main", expected_head=a, reason="epoch 1")
    again = repo.commit(m, "main", expected_head=a, reason="epoch 1 (retry)")
    assert again == first
    assert [e.new for e in repo.reflog("heads/main")] == [a, first]


def test_reflog_limit_returns_the_latest_entries(repo: Repository) -> None:
    ids = commit_chain(repo, 6)
    assert [e.new for e in repo.reflog("heads/main", limit=2)] == ids[-2:]
    assert [e.seq for e in repo.reflog("heads/main", limit=10)] == [1, 2, 3, 4, 5, 6]
    assert repo.reflog("heads/main", limit=0) == []


class _LostResponseBackend(PrefixedBackend):
    """Performs conditional writes but reports them as lost races once, like a retried
    request whose first attempt succeeded but whose response never arrived."""

    def __init__(self, inner: Backend, prefix: str) -> None:
        super().__init__(inner, prefix)
        self.lie_next = False

    def put_if_match(self, key: str, data: bytes, version: str) -> str | None:
        written = super().put_if_match(key, data, version)
        if self.lie_next and key.startswith("refs/"):
            self.lie_next = False
            return None
        return written


def test_cas_whose_response_was_lost_is_recognised_as_own_write(store_url: str) -> None:
    backend = _LostResponseBackend(open_backend(store_url), "app")
    repo = Repository(backend)
    a, b = commit_chain(repo, 2)
    backend.lie_next = True
    m = manifest(epoch=5, parents=(b,))
    c = repo.commit(m, "main", expected_head=b, reason="after a lost response")
    assert repo.read_ref("heads/main").target == c  # type: ignore[union-attr]
    assert [e.new for e in repo.reflog("heads/main")] == [a, b, c]


def test_threads_sharing_one_repository_lose_no_update(repo: Repository) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def work(worker: int) -> int:
        done = conflicts = 0
        while done < 10:
            head = repo.read_ref("heads/main")
            target = None if head is None else head.target
            chunk = repo.put_object("chunk", f"{worker}-{done}".encode())
            m = manifest(
                epoch=0 if target is None else repo.read_manifest(target).epoch + 1,
                parents=(target,) if target else (),
                key_groups={worker: [chunk]},
            )
            try:
                repo.commit(m, "main", expected_head=target, reason=f"t{worker}")
                done += 1
            except RefConflictError:
                conflicts += 1
        return conflicts

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(work, range(4)))
    assert len(list(repo.log("main", first_parent=True))) == 40
    assert [e.seq for e in repo.reflog("heads/main")] == list(range(1, 41))


class _SpuriousRefusalBackend(PrefixedBackend):
    """Refuses the first conditional write although nothing changed (S3 may answer 409)."""

    def __init__(self, inner: Backend, prefix: str) -> None:
        super().__init__(inner, prefix)
        self.refusals = 0

    def put_if_match(self, key: str, data: bytes, version: str) -> str | None:
        if self.refusals == 0:
            self.refusals += 1
            return None
        return super().put_if_match(key, data, version)


def test_spuriously_refused_cas_and_control_writes_are_retried(store_url: str) -> None:
    backend = _SpuriousRefusalBackend(open_backend(store_url), "app")
    repo = Repository(backend)
    a, b = commit_chain(repo, 2)
    assert backend.refusals == 1
    assert [e.new for e in repo.reflog("heads/main")] == [a, b]
    v1 = repo.write_control("main", {"p": 1}, None)
    backend.refusals = 0
    v2 = repo.write_control("main", {"p": 2}, v1)
    assert repo.read_control("main") == ({"p": 2}, v2)


def test_commit_refuses_a_parent_that_is_not_a_manifest(repo: Repository) -> None:
    chunk = repo.put_object("chunk", b"not a snapshot")
    with pytest.raises(MalformedManifestError, match="not a manifest"):
        repo.commit(manifest(parents=(chunk,)), "main", expected_head=None, reason="x")
    assert repo.list_refs() == {}
