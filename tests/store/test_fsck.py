"""fsck detects each injected fault and names it (ref, snapshot, key group, object)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from snapshots_store import CorruptObjectError, Repository, check_repository
from snapshots_store.codec import canonical_json
from snapshots_store.fsck import FsckProblem
from snapshots_store.objects import encode, object_key
from snapshots_store.reflog import entry_key

from .helpers import commit_chain, manifest


def _history(repo: Repository) -> dict[str, str]:
    """main: s0 <- s1 <- s2, each with one chunk (key group = epoch) and one output."""
    ids = commit_chain(repo, 3)
    m1 = repo.read_manifest(ids[1])
    ((group, (chunk,)),) = m1.key_groups.items()
    return {
        "s0": ids[0],
        "s1": ids[1],
        "s2": ids[2],
        "chunk": chunk,
        "group": str(group),
        "output": m1.outputs[0],
    }


def _stored(repo: Repository, oid: str) -> bytes:
    blob = repo.backend.get(object_key(oid))
    assert blob is not None
    return blob.data


def flip_chunk_byte(repo: Repository, h: dict[str, str]) -> None:
    data = bytearray(_stored(repo, h["chunk"]))
    data[-2] ^= 0x40
    repo.backend.put(object_key(h["chunk"]), bytes(data))


def truncate_chunk(repo: Repository, h: dict[str, str]) -> None:
    repo.backend.put(object_key(h["chunk"]), _stored(repo, h["chunk"])[:-4])


def delete_chunk(repo: Repository, h: dict[str, str]) -> None:
    repo.backend.delete(object_key(h["chunk"]))


def delete_output(repo: Repository, h: dict[str, str]) -> None:
    repo.backend.delete(object_key(h["output"]))


def replace_chunk_with_other_kind(repo: Repository, h: dict[str, str]) -> None:
    # Stored bytes of an object of another kind under the chunk's key: the hash check fails.
    repo.backend.put(object_key(h["chunk"]), encode("output", b"not the chunk"))


def dangling_ref(repo: Repository, h: dict[str, str]) -> None:
    repo.backend.delete(object_key(h["s2"]))


def corrupt_parent_manifest(repo: Repository, h: dict[str, str]) -> None:
    data = bytearray(_stored(repo, h["s1"]))
    data[20] ^= 0x01
    repo.backend.put(object_key(h["s1"]), bytes(data))


def malformed_manifest_at_tag(repo: Repository, h: dict[str, str]) -> None:
    doc = manifest().to_dict()
    doc["parallelism"] = 0
    bad = repo.put_object("manifest", canonical_json(doc))
    h["bad"] = bad
    # Plumbing: the porcelain refuses to point a ref at a malformed manifest.
    repo.refs.cas("tags/broken", None, bad, operation_id=None, reason="test", at="x")


def reflog_gap(repo: Repository, h: dict[str, str]) -> None:
    repo.backend.delete(entry_key("heads/main", 2))


def garbage_reflog_entry(repo: Repository, h: dict[str, str]) -> None:
    repo.backend.put(entry_key("heads/main", 1), b"\x00garbage")


def bad_ref_document(repo: Repository, h: dict[str, str]) -> None:
    repo.backend.put("refs/tags/garbage", b"{not json")


FAULTS: dict[str, tuple[Callable[[Repository, dict[str, str]], None], dict[str, str | None]]] = {
    "flipped byte": (
        flip_chunk_byte,
        {"kind": "corrupt-object", "snapshot_id": "s1", "key_group": "group", "object_id": "chunk"},
    ),
    "truncated object": (
        truncate_chunk,
        {"kind": "corrupt-object", "snapshot_id": "s1", "key_group": "group", "object_id": "chunk"},
    ),
    "missing object": (
        delete_chunk,
        {"kind": "missing-object", "snapshot_id": "s1", "key_group": "group", "object_id": "chunk"},
    ),
    "missing output": (
        delete_output,
        {"kind": "missing-object", "snapshot_id": "s1", "key_group": None, "object_id": "output"},
    ),
    "object of another kind": (
        replace_chunk_with_other_kind,
        {"kind": "corrupt-object", "snapshot_id": "s1", "key_group": "group", "object_id": "chunk"},
    ),
    "dangling ref": (
        dangling_ref,
        {"kind": "dangling-ref", "ref": "heads/main", "snapshot_id": "s2", "object_id": "s2"},
    ),
    "corrupt parent manifest": (
        corrupt_parent_manifest,
        {"kind": "corrupt-object", "snapshot_id": "s2", "object_id": "s1"},
    ),
    "malformed manifest": (
        malformed_manifest_at_tag,
        {"kind": "malformed-manifest", "ref": "tags/broken", "object_id": "bad"},
    ),
    "reflog gap": (reflog_gap, {"kind": "reflog-gap", "ref": "heads/main"}),
    "bad ref document": (bad_ref_document, {"kind": "bad-ref", "ref": "tags/garbage"}),
    "garbage reflog entry": (garbage_reflog_entry, {"kind": "bad-reflog", "ref": "heads/main"}),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fsck_detects_and_names_each_fault(any_repo: Repository, fault: str) -> None:
    h = _history(any_repo)
    assert check_repository(any_repo).ok
    inject, expected = FAULTS[fault]
    inject(any_repo, h)
    report = check_repository(any_repo)
    assert not report.ok
    assert len(report.problems) == 1, report.problems
    problem: FsckProblem = report.problems[0]
    for name, value in expected.items():
        actual = getattr(problem, name)
        if name == "kind" or name == "ref":
            assert actual == value
        elif name == "key_group":
            assert actual == (None if value is None else int(h[value]))
        else:
            assert actual == h[value]  # type: ignore[index]
            assert h[value][:12] in problem.message  # type: ignore[index]


def test_shared_broken_chunk_is_reported_once(repo: Repository) -> None:
    chunk = repo.put_object("chunk", b"shared")
    head = None
    for epoch in range(4):
        m = manifest(epoch=epoch, parents=(head,) if head else (), key_groups={3: [chunk]})
        head = repo.commit(m, "main", expected_head=head, reason="e")
    repo.backend.delete(object_key(chunk))
    problems = check_repository(repo).problems
    assert [(p.kind, p.object_id, p.key_group) for p in problems] == [("missing-object", chunk, 3)]
    assert problems[0].snapshot_id == head  # the newest snapshot that needs it


def test_reading_corrupt_object_never_returns_wrong_bytes(any_repo: Repository) -> None:
    h = _history(any_repo)
    flip_chunk_byte(any_repo, h)
    with pytest.raises(CorruptObjectError, match=h["chunk"]):
        any_repo.get_object(h["chunk"])


def test_output_listed_as_chunk_is_a_wrong_kind(repo: Repository) -> None:
    output = repo.put_object("output", b"rows")
    sid = repo.commit(manifest(key_groups={4: [output]}), "main", expected_head=None, reason="x")
    problems = check_repository(repo).problems
    assert [(p.kind, p.snapshot_id, p.key_group, p.object_id) for p in problems] == [
        ("wrong-kind", sid, 4, output)
    ]
    assert "is of kind output, expected chunk" in problems[0].message
