"""fsck: verify everything reachable from the refs, naming each problem precisely.

Checks every live ref's document and target, every reachable manifest (presence, hash,
kind, schema), every chunk and output it names (presence, hash, kind) and every reflog
(gap-free, well-formed). Each problem names the ref, snapshot, key group and object.
Each object is read once, however many snapshots share it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from snapshots_store.errors import (
    CorruptObjectError,
    MalformedManifestError,
    ObjectNotFoundError,
    StoreError,
)
from snapshots_store.manifest import Manifest
from snapshots_store.names import REFS_PREFIX, check_ref_name
from snapshots_store.packs import split_ref
from snapshots_store.reflog import read_history
from snapshots_store.refs import RefDocument, parse_ref_document

if TYPE_CHECKING:
    from snapshots_store.repository import Repository


@dataclass(frozen=True)
class FsckProblem:
    """One problem. `kind`: missing-object, corrupt-object, wrong-kind, malformed-manifest,
    dangling-ref, bad-ref, reflog-gap, bad-reflog."""

    kind: str
    message: str
    ref: str | None = None
    snapshot_id: str | None = None
    key_group: int | None = None
    object_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "message": self.message,
            "ref": self.ref,
            "snapshot_id": self.snapshot_id,
            "key_group": self.key_group,
            "object_id": self.object_id,
        }


@dataclass(frozen=True)
class FsckReport:
    problems: tuple[FsckProblem, ...]
    refs_checked: int
    snapshots_checked: int
    objects_checked: int

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "refs_checked": self.refs_checked,
            "snapshots_checked": self.snapshots_checked,
            "objects_checked": self.objects_checked,
            "problems": [p.to_dict() for p in self.problems],
        }


class _Checker:
    def __init__(self, repo: Repository) -> None:
        self.repo = repo
        self.problems: list[FsckProblem] = []
        self.reads: dict[str, tuple[str | None, str]] = {}  # id -> (problem, detail or kind)
        self.manifests: dict[str, Manifest | None] = {}
        self.reported: set[tuple[str, str]] = set()

    def _read(self, oid: str) -> tuple[str | None, str]:
        try:
            kind, payload = self.repo.objects.get(oid)
        except ObjectNotFoundError:
            return "missing-object", "is missing"
        except CorruptObjectError as exc:
            return "corrupt-object", f"is corrupt ({exc.detail})"
        if kind == "manifest":
            try:
                self.manifests[oid] = Manifest.from_bytes(payload, oid)
            except MalformedManifestError as exc:
                self.manifests[oid] = None
                return "malformed-manifest", f"is malformed: field `{exc.field}` {exc.detail}"
        return None, kind

    def _object(self, oid: str, expected_kind: str) -> tuple[str | None, str]:
        """(problem, detail) of an object used as `expected_kind`; each object is read once.

        The detail is empty when the same problem was already reported for this object.
        """
        if oid not in self.reads:
            self.reads[oid] = self._read(oid)
        problem, detail = self.reads[oid]
        if problem is None:
            if detail == expected_kind:
                return None, ""
            problem, detail = "wrong-kind", f"is of kind {detail}, expected {expected_kind}"
        first = (oid, problem) not in self.reported
        self.reported.add((oid, problem))
        return problem, detail if first else ""

    def _member(self, pack_id: str, key_group: int) -> tuple[str | None, str]:
        """A sound pack (every member verified by `_object`) lacking the named member."""
        if key_group in self.repo.chunks.index(pack_id).members:
            return None, ""
        first = (f"{pack_id}:{key_group}", "missing-object") not in self.reported
        self.reported.add((f"{pack_id}:{key_group}", "missing-object"))
        return "missing-object", f"has no member for key group {key_group}" if first else ""

    def check_refs(self) -> list[tuple[str, str]]:
        targets: list[tuple[str, str]] = []
        for info in self.repo.backend.list(REFS_PREFIX):
            name = info.key[len(REFS_PREFIX) :]
            try:
                check_ref_name(name)
            except StoreError:
                self._add("bad-ref", f"{info.key} is not a valid ref name", ref=name)
                continue
            blob = self.repo.backend.get(info.key)
            if blob is None:
                continue
            try:
                doc = parse_ref_document(name, blob.data, blob.version)
            except StoreError as exc:
                self._add("bad-ref", f"ref {name}: {exc}", ref=name)
                continue
            self.check_reflog(doc)
            if doc.target is not None:
                targets.append((name, doc.target))
        return targets

    def check_reflog(self, doc: RefDocument) -> None:
        try:
            _, missing = read_history(self.repo.backend, doc.name, doc.entry)
        except StoreError as exc:
            self._add("bad-reflog", f"reflog of {doc.name}: {exc}", ref=doc.name)
            return
        if missing:
            self._add(
                "reflog-gap",
                f"reflog of {doc.name} lacks entries {missing[:10]} of ..{doc.seq}",
                ref=doc.name,
            )

    def walk(self, targets: list[tuple[str, str]]) -> int:
        queue: deque[str] = deque()
        for name, target in targets:
            problem, detail = self._object(target, "manifest")
            detail = detail or "has the problem reported above"
            if problem is None:
                queue.append(target)
            elif problem == "missing-object":
                self._add(
                    "dangling-ref",
                    f"ref {name} points at snapshot {target}, which {detail}",
                    ref=name,
                    snapshot_id=target,
                    object_id=target,
                )
            else:
                self._add(
                    problem,
                    f"snapshot {target} (target of ref {name}) {detail}",
                    ref=name,
                    snapshot_id=target,
                    object_id=target,
                )
        seen: set[str] = set()
        while queue:
            sid = queue.popleft()
            if sid in seen:
                continue
            seen.add(sid)
            manifest = self.manifests[sid]
            assert manifest is not None
            for parent in manifest.parents:
                problem, detail = self._object(parent, "manifest")
                if problem is None:
                    queue.append(parent)
                elif detail:
                    self._add(
                        problem,
                        f"snapshot {sid}: parent snapshot {parent} {detail}",
                        snapshot_id=sid,
                        object_id=parent,
                    )
            self.check_contents(sid, manifest)
        return len(seen)

    def check_contents(self, sid: str, manifest: Manifest, *, outputs: bool = True) -> None:
        """The chunks of every key group `manifest` names (and its sink outputs)."""
        for group, chunks in manifest.key_groups.items():
            for chunk in chunks:
                oid, member = split_ref(chunk)
                problem, detail = self._object(oid, "chunk" if member is None else "pack")
                if problem is None and member is not None:
                    problem, detail = self._member(oid, member)
                if problem is not None and detail:
                    self._add(
                        problem,
                        f"snapshot {sid}: key group {group} chunk {chunk} {detail}",
                        snapshot_id=sid,
                        key_group=group,
                        object_id=oid,
                    )
        if not outputs:
            return
        for output in manifest.outputs:
            problem, detail = self._object(output, "output")
            if problem is not None and detail:
                self._add(
                    problem,
                    f"snapshot {sid}: sink output {output} {detail}",
                    snapshot_id=sid,
                    object_id=output,
                )

    def _add(self, kind: str, message: str, **where: Any) -> None:
        self.problems.append(FsckProblem(kind, message, **where))


def check_repository(repo: Repository) -> FsckReport:
    """Verify the repository; a report with no problems means every reachable byte is sound."""
    checker = _Checker(repo)
    targets = checker.check_refs()
    snapshots = checker.walk(targets)
    return FsckReport(
        problems=tuple(checker.problems),
        refs_checked=len(targets),
        snapshots_checked=snapshots,
        objects_checked=len(checker.reads),
    )


def check_snapshot(repo: Repository, snapshot_id: str) -> tuple[FsckProblem, ...]:
    """What keeps `snapshot_id` from being restored: its manifest and every chunk of its
    state, each verified against its hash (empty: it restores exactly as committed)."""
    return _snapshot_problems(_Checker(repo), snapshot_id)


def _snapshot_problems(checker: _Checker, snapshot_id: str) -> tuple[FsckProblem, ...]:
    checker.problems, checker.reported = [], set()  # reads stay cached across snapshots
    problem, detail = checker._object(snapshot_id, "manifest")
    if problem is not None:
        checker._add(problem, f"snapshot {snapshot_id} {detail}", snapshot_id=snapshot_id,
                     object_id=snapshot_id)  # fmt: skip
        return tuple(checker.problems)
    manifest = checker.manifests[snapshot_id]
    assert manifest is not None
    checker.check_contents(snapshot_id, manifest, outputs=False)
    return tuple(checker.problems)


def newest_intact_ancestor(repo: Repository, snapshot_id: str) -> str | None:
    """The newest snapshot on `snapshot_id`'s first-parent line (itself included) that
    `check_snapshot` finds sound; None when there is none. Each object is read once."""
    checker = _Checker(repo)
    sid: str | None = snapshot_id
    while sid is not None:
        if not _snapshot_problems(checker, sid):
            return sid
        manifest = checker.manifests.get(sid)
        if manifest is None:
            return None  # the line is broken here: nothing older can be reached
        sid = manifest.parents[0] if manifest.parents else None
    return None


def newest_intact_on_branch(repo: Repository, branch: str) -> str | None:
    """The snapshot a rollback of `branch` should go to: the newest intact one on the head's
    first-parent line; when that line is broken (a damaged manifest), the newest intact one
    among the branch's earlier heads (its reflog, newest first)."""
    head = repo.read_ref(f"heads/{branch}")
    if head is None:
        return None
    intact = newest_intact_ancestor(repo, head.target)
    if intact is not None:
        return intact
    try:
        entries = repo.reflog(f"heads/{branch}")
    except StoreError:
        return None
    for entry in sorted(entries, key=lambda e: e.seq, reverse=True):
        if entry.new is not None and entry.new != head.target:
            intact = newest_intact_ancestor(repo, entry.new)
            if intact is not None:
                return intact
    return None
