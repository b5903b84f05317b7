"""`Repository`: the porcelain — the verbs the engine and the control plane use.

One repository is one namespace (application) of a store root. Plumbing lives in
`objects`, `refs`, `reflog`, `control`, `graph` and `diff`; this class wires
them to one backend and adds the checks that keep the store consistent (a ref only ever
points at a verified manifest; a commit's parents exist before it is written). Maintenance
takes a repository and lives outside it, like dulwich's porcelain: `gc.collect_garbage(repo)`
and `fsck.check_repository(repo)`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from snapshots_store import graph
from snapshots_store.backends import Backend, PrefixedBackend, open_backend
from snapshots_store.codec import format_timestamp
from snapshots_store.control import ControlStore
from snapshots_store.diff import SnapshotDiff, diff_manifests
from snapshots_store.errors import (
    MalformedManifestError,
    ObjectNotFoundError,
    RefConflictError,
    RefNotFoundError,
    StoreError,
    UnknownRevisionError,
)
from snapshots_store.manifest import Manifest
from snapshots_store.names import check_branch_name, check_namespace, check_ref_name
from snapshots_store.objects import ObjectStore, check_kind, check_object_id
from snapshots_store.packs import PACK_BYTES, ChunkReader, chunk_ref, plan_packs
from snapshots_store.reflog import ReflogEntry, read_history
from snapshots_store.refs import RefStore, RefValue
from snapshots_store.revisions import Revision, parse_revision

if TYPE_CHECKING:
    from snapshots_store.backends.s3 import S3Credentials

_MANIFEST_CACHE_SIZE = 4096


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _rebuild(backend: Backend) -> Repository:
    return Repository(backend)


class Repository:
    """Snapshots, refs, reflog and control documents of one application namespace."""

    def __init__(
        self,
        backend: Backend,
        *,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.backend = backend
        self.objects = ObjectStore(backend)
        self.refs = RefStore(backend)
        self.control = ControlStore(backend)
        self.chunks = ChunkReader(backend, self.objects)
        self._custom_clock = clock
        self._clock = clock or _utc_now
        self._manifests: OrderedDict[str, Manifest] = OrderedDict()
        self._cache_lock = threading.Lock()

    def __reduce__(self) -> tuple[Any, tuple[Backend], dict[str, Any]]:
        """Picklable (e.g. captured by a Spark closure): backend and clock, not the cache."""
        return (_rebuild, (self.backend,), {"clock": self._custom_clock})

    def __setstate__(self, state: dict[str, Any]) -> None:
        if state["clock"] is not None:
            self._custom_clock = self._clock = state["clock"]

    @classmethod
    def open(
        cls,
        url: str,
        namespace: str,
        *,
        clock: Callable[[], datetime] | None = None,
        credentials: S3Credentials | None = None,
    ) -> Repository:
        """The repository of `namespace` in the store at `url`; creates nothing until a write.
        `credentials`: an S3 store's access key (default: boto3's own search)."""
        check_namespace(namespace)
        backend = open_backend(url, credentials=credentials)
        return cls(PrefixedBackend(backend, namespace), clock=clock)

    def __repr__(self) -> str:
        return f"Repository({self.backend.url!r})"

    def now(self) -> datetime:
        return self._clock()

    # -- objects ---------------------------------------------------------------------------

    def put_object(self, kind: str, payload: bytes) -> str:
        """Store bytes of a kind (chunk, output, manifest, blob); idempotent, returns the id."""
        check_kind(kind)
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise TypeError(f"an object payload is bytes, not {type(payload).__name__}")
        return self.objects.put(kind, bytes(payload))

    def get_object(self, object_id: str) -> bytes:
        """The verified payload; ObjectNotFoundError / CorruptObjectError otherwise."""
        return self.objects.get(check_object_id(object_id))[1]

    def get_object_with_kind(self, object_id: str) -> tuple[str, bytes]:
        return self.objects.get(check_object_id(object_id))

    def has_object(self, object_id: str) -> bool:
        return self.objects.has(check_object_id(object_id))

    # -- key-group chunks ------------------------------------------------------------------

    def put_chunks(
        self, payloads: Mapping[int, bytes], *, pack_bytes: int = PACK_BYTES
    ) -> dict[int, str]:
        """Store key-group chunk payloads as packs of at most `pack_bytes` payload bytes (one
        durable write per pack); returns each key group's chunk ref ``<pack id>:<kg>``."""
        refs: dict[int, str] = {}
        sizes = {kg: len(payload) for kg, payload in payloads.items()}
        for groups in plan_packs(sizes, pack_bytes):
            pack_id = self.objects.put_pack({kg: payloads[kg] for kg in groups})
            refs.update((kg, chunk_ref(pack_id, kg)) for kg in groups)
        return refs

    def read_chunk(self, ref: str) -> bytes:
        """The verified payload of one chunk ref (a loose chunk id or ``<pack id>:<kg>``)."""
        return self.chunks.read([ref])[0]

    def read_chunks(self, refs: Sequence[str]) -> list[bytes]:
        """Verified payloads of chunk refs, in order, with few long reads (see packs.py)."""
        return self.chunks.read(refs)

    def chunk_size(self, ref: str) -> int | None:
        """Stored bytes of one chunk ref; None when its object is missing."""
        return self.chunks.stored_size(ref)

    # -- manifests -------------------------------------------------------------------------

    def write_manifest(self, manifest: Manifest) -> str:
        if not isinstance(manifest, Manifest):
            raise MalformedManifestError("(document)", "must be a Manifest instance")
        oid = self.objects.put("manifest", manifest.to_bytes())
        self._remember(oid, manifest)
        return oid

    def read_manifest(self, snapshot_id: str) -> Manifest:
        """The manifest with that id (verified, cached: manifests are immutable)."""
        check_object_id(snapshot_id)
        with self._cache_lock:
            cached = self._manifests.get(snapshot_id)
            if cached is not None:
                self._manifests.move_to_end(snapshot_id)
                return cached
        kind, payload = self.objects.get(snapshot_id, context="manifest")
        if kind != "manifest":
            raise MalformedManifestError(
                "(object kind)", f"is {kind!r}: the object is not a manifest", snapshot_id
            )
        manifest = Manifest.from_bytes(payload, snapshot_id)
        self._remember(snapshot_id, manifest)
        return manifest

    def _remember(self, oid: str, manifest: Manifest) -> None:
        with self._cache_lock:
            self._manifests[oid] = manifest
            self._manifests.move_to_end(oid)
            while len(self._manifests) > _MANIFEST_CACHE_SIZE:
                self._manifests.popitem(last=False)

    # -- refs ------------------------------------------------------------------------------

    def read_ref(self, name: str) -> RefValue | None:
        """Where `name` (``heads/x`` / ``tags/y``) points, or None when it does not exist."""
        return self.refs.read(name)

    def cas_ref(
        self,
        name: str,
        expected: str | None,
        new: str,
        *,
        operation_id: str | None = None,
        reason: str,
    ) -> RefValue:
        """Move `name` from `expected` (None = must not exist) to the manifest `new`.

        `new` must be a stored, valid manifest; RefConflictError when the ref is elsewhere.
        """
        check_ref_name(name)
        check_object_id(new)
        if expected is not None:
            check_object_id(expected)
        self.read_manifest(new)
        doc = self.refs.cas(
            name, expected, new, operation_id=operation_id, reason=reason, at=self._stamp()
        )
        return RefValue(new, doc.seq)

    def delete_ref(
        self, name: str, expected: str, *, operation_id: str | None = None, reason: str
    ) -> None:
        """Delete `name` if it still points at `expected` (the reflog records the deletion)."""
        check_ref_name(name)
        check_object_id(expected)
        if self.refs.read(name) is None:
            raise RefNotFoundError(check_ref_name(name))
        self.refs.cas(
            name, expected, None, operation_id=operation_id, reason=reason, at=self._stamp()
        )

    def list_refs(self, prefix: str = "") -> dict[str, RefValue]:
        """Live refs by full name (``heads/main`` …) whose name starts with `prefix`."""
        return self.refs.list(prefix)

    def reflog(self, name: str, *, limit: int | None = None) -> list[ReflogEntry]:
        """Every retained move of `name` (only the latest `limit` if given), oldest first.

        gc prunes entries older than its retention window (always the oldest ones).
        RefNotFoundError when the ref never existed; entries of a deleted ref stay readable.
        """
        name = check_ref_name(name)
        if limit is not None and limit < 0:
            raise ValueError("limit must be >= 0")
        current = self.refs.read_document(name)  # first the ref, then the log: see reflog.py
        entry = None if current is None else current.entry
        entries, missing = read_history(self.backend, name, entry, limit=limit)
        if current is None and not entries:
            raise RefNotFoundError(name)
        if missing:
            raise StoreError(
                f"reflog of {name} lacks entries {missing[:5]}; the store is damaged: run fsck"
            )
        return entries

    def commit(
        self,
        manifest: Manifest,
        branch: str,
        *,
        expected_head: str | None,
        operation_id: str | None = None,
        reason: str,
    ) -> str:
        """Write `manifest`, then CAS ``heads/<branch>`` from `expected_head` to it.

        The CAS is the commit point: a crash before it leaves only unreferenced objects.
        Parents must be stored, valid manifests. Returns the new snapshot id. Idempotent: when the
        branch already points at this very manifest (a retry after a commit whose CAS
        succeeded), the id is returned and nothing is written to the reflog.
        """
        check_branch_name(branch)
        if expected_head is not None:
            check_object_id(expected_head)
        if not isinstance(manifest, Manifest):
            raise MalformedManifestError("(document)", "must be a Manifest instance")
        if manifest.branch != branch:
            raise MalformedManifestError(
                "branch", f"is {manifest.branch!r} but the commit targets branch {branch!r}"
            )
        for parent in manifest.parents:
            try:
                self.read_manifest(parent)  # stored, sound, a manifest (usually cached)
            except ObjectNotFoundError:
                raise ObjectNotFoundError(
                    parent, "parent of the manifest being committed"
                ) from None
        snapshot_id = self.write_manifest(manifest)
        try:
            self.refs.cas(
                f"heads/{branch}",
                expected_head,
                snapshot_id,
                operation_id=operation_id,
                reason=reason,
                at=self._stamp(),
            )
        except RefConflictError as exc:
            if exc.actual != snapshot_id:
                raise
        return snapshot_id

    def _stamp(self) -> str:
        return format_timestamp(self.now())

    # -- revisions -------------------------------------------------------------------------

    def resolve(self, rev: str) -> str:
        """The snapshot id a revision names (`snapshots_store.revisions`: a full id,
        ``heads/x`` / ``tags/y``, a bare branch then tag name, a unique id prefix of at least
        8 hex digits, then any ``~n`` / ``^n`` steps). InvalidRevisionError for a text that is
        no revision, UnknownRevisionError for one that names no snapshot."""
        parsed = parse_revision(rev)
        snapshot_id = self._resolve_base(parsed)
        for taken, step in enumerate(parsed.steps):
            if step.kind == "~":
                snapshot_id = self._ancestor(parsed, taken, snapshot_id)
            elif step.count:
                snapshot_id = self._parent(rev, snapshot_id, step.count)
        return snapshot_id

    def _resolve_base(self, parsed: Revision) -> str:
        rev = parsed.base
        if parsed.object_id is not None:
            if not self.has_object(rev):
                raise UnknownRevisionError(rev, "no object with this id is stored")
            return rev
        for candidate in parsed.refs:
            value = self.refs.read(candidate)
            if value is not None:
                return value.target
        if parsed.prefix is not None:
            found = self.objects.ids_with_prefix(rev)
            if len(found) > 1:
                found = [oid for oid in found if self._is_manifest(oid)]
            if len(found) == 1:
                return found[0]
            if len(found) > 1:
                raise UnknownRevisionError(rev, f"the prefix is ambiguous ({len(found)} snapshots)")
        raise UnknownRevisionError(rev, "no ref or snapshot matches")

    def _ancestor(self, parsed: Revision, taken: int, snapshot_id: str) -> str:
        """``~count`` of step `taken` from `snapshot_id`: its count-th first-parent ancestor."""
        steps = parsed.steps[taken].count
        prefix = parsed.through(taken)
        for step in range(steps):
            parents = self.read_manifest(snapshot_id).parents
            if not parents:
                raise UnknownRevisionError(
                    parsed.text,
                    f"it goes back past the root: {prefix}~{step} is the first commit "
                    f"of its line ({snapshot_id[:12]}), {steps - step} step(s) short of "
                    f"{steps}; use {prefix}~{step} or less",
                )
            snapshot_id = parents[0]
        return snapshot_id

    def _is_manifest(self, oid: str) -> bool:
        try:
            return self.objects.get(oid)[0] == "manifest"
        except StoreError:
            return False

    def _parent(self, rev: str, snapshot_id: str, n: int) -> str:
        parents = self.read_manifest(snapshot_id).parents
        if n > len(parents):
            raise UnknownRevisionError(rev, f"snapshot {snapshot_id} has {len(parents)} parent(s)")
        return parents[n - 1]

    # -- history ---------------------------------------------------------------------------

    def log(
        self, rev: str, *, first_parent: bool = False, limit: int | None = None
    ) -> Iterator[tuple[str, Manifest]]:
        """(id, manifest) from `rev` back: first-parent chain or full topological order."""
        return graph.log(
            self.read_manifest, self.resolve(rev), first_parent=first_parent, limit=limit
        )

    def ancestors(self, rev: str) -> set[str]:
        """Every snapshot in the history of `rev`, `rev` itself included."""
        return graph.ancestors(self.read_manifest, [self.resolve(rev)])

    def is_ancestor(self, a: str, b: str) -> bool:
        """True when `a` is in the history of `b` (true for a == b)."""
        return graph.is_ancestor(self.read_manifest, self.resolve(a), self.resolve(b))

    def merge_base(self, a: str, b: str) -> str | None:
        """The newest best common ancestor of `a` and `b`, None when histories are disjoint."""
        return graph.merge_base(self.read_manifest, self.resolve(a), self.resolve(b))

    def merge_bases(self, a: str, b: str) -> list[str]:
        """All best common ancestors (several after criss-cross merges), newest first."""
        return graph.merge_bases(self.read_manifest, self.resolve(a), self.resolve(b))

    def diff(self, a: str, b: str) -> SnapshotDiff:
        """Key groups added/changed/removed (stored sizes) and offsets advanced from a to b."""
        old_id, new_id = self.resolve(a), self.resolve(b)
        return diff_manifests(
            old_id, self.read_manifest(old_id), new_id, self.read_manifest(new_id), self.chunk_size
        )

    # -- control documents -----------------------------------------------------------------

    def read_control(self, branch: str) -> tuple[dict[str, Any], str | None]:
        """(document, version token) of a branch's control document; ({}, None) if absent."""
        return self.control.read(branch)

    def write_control(self, branch: str, doc: dict[str, Any], expected_version: str | None) -> str:
        """CAS the control document; returns the new version (ControlConflictError if stale)."""
        return self.control.write(branch, doc, expected_version)
