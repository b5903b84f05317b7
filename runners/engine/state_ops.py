"""State operations: the store-level primitives behind migrate, rehash, fork, rollback, rescale.

No Django and no Spark: the control plane calls these from Celery tasks. Each is idempotent
and safe to re-run after a crash: objects are content-addressed (writing one again writes
the same bytes), and the only commit point of each operation is one compare-and-swap of a
branch ref; a re-run that finds the branch already at an equal commit returns it.

- `copy_branch` copies everything reachable from a branch head to another store and points
  the same branch there at the same snapshot id.
- `rehash` changes the max parallelism M of a snapshot's state (a "migration" commit).
- `transform_state` applies a user migration function to every key group's state table
  (a "migration" commit); `load_migration` resolves one registered as an entry point.
- `new_branch_commit` commits a snapshot's state again on a branch (fork, rollback, rescale,
  savepoint) with provenance and no outputs, so a branch's output never double counts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runners import entry_points
from runners.engine import chunks
from runners.engine.hashing import key_groups as hash_key_groups
from runners.engine.keygroups import check_max_parallelism, check_parallelism
from runners.engine.sources import Source
from runners.engine.tasks import STATE
from snapshots_store import Manifest, ObjectNotFoundError, RefConflictError, Repository
from snapshots_store.codec import format_timestamp
from snapshots_store.objects import decode, object_key
from snapshots_store.packs import PACK_BYTES, ref_objects

Progress = Callable[[int, int], None]
MigrationFn = Callable[[pa.Table], pa.Table]

#: kinds `new_branch_commit` makes (epochs and migrations have their own paths)
BRANCH_COMMIT_KINDS: Final = frozenset({"fork", "rollback", "rescale", "savepoint"})
#: like `put_object`: an existing object older than this is rewritten (same bytes) so that
#: gc's grace period protects it until the ref that needs it is moved
_REFRESH_AFTER: Final = timedelta(hours=1)


class StateOperationError(RuntimeError):
    """A state operation cannot be done as asked; the message says what to do instead."""


class MigrationError(StateOperationError):
    """A migration function or reference is unusable, or its result breaks the state's rules."""


class BranchConflictError(RefConflictError):
    """The branch is not where the operation needs it (a `RefConflictError`: HTTP 409)."""

    def __init__(self, name: str, expected: str | None, actual: str | None, advice: str) -> None:
        super().__init__(name, expected, actual)
        self.args = (advice,)


# -- copy ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CopyResult:
    """What `copy_branch` did. Bytes are stored (compressed) object sizes."""

    branch: str
    snapshot_id: str
    manifests: int
    objects_copied: int
    bytes_copied: int
    objects_skipped: int
    bytes_skipped: int
    previous_target: str | None
    ref_moved: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def reachable_objects(repo: Repository, snapshot_id: str) -> tuple[list[str], list[str]]:
    """(manifests, data objects) reachable from a snapshot: every ancestor's manifest, parents
    before children, and their key-group chunks and outputs (each once, in first-use order)."""
    manifests = [sid for sid, _ in repo.log(snapshot_id)]
    manifests.reverse()
    seen: set[str] = set()
    data: list[str] = []
    for sid in manifests:
        m = repo.read_manifest(sid)
        chunk_objects = ref_objects(c for chain in m.key_groups.values() for c in chain)
        for oid in chunk_objects + list(m.outputs):
            if oid not in seen:
                seen.add(oid)
                data.append(oid)
    return manifests, data


def copy_branch(
    src: Repository,
    dst: Repository,
    branch: str,
    *,
    progress: Progress | None = None,
    operation_id: str | None = None,
    reason: str | None = None,
    verify_existing: bool = False,
    force: bool = False,
) -> CopyResult:
    """Copy every object reachable from `branch`'s head in `src` to `dst`, then create or move
    ``heads/<branch>`` in `dst` by CAS to the same snapshot id (ids are content hashes).

    Objects `dst` already has are skipped (read and hash-checked too with
    `verify_existing`); copied objects are hash-checked on the way (the stored bytes are
    copied as they are). A manifest is written only after its parents and all its objects,
    so a crash leaves `dst` consistent, and re-running finishes the job. The branch in `dst`
    may be absent, at the same snapshot, or at an ancestor of it (fast-forward); anything
    else is refused unless `force` (the reflog keeps the old target). `progress(done,
    total)` is called after every object.
    """
    head_ref = src.read_ref(f"heads/{branch}")
    if head_ref is None:
        raise StateOperationError(
            f"branch {branch!r} does not exist in the source store {src.backend.url}: "
            "nothing to copy; list branches with `python -m snapshots_store … refs heads/`"
        )
    head = head_ref.target
    manifests, data = reachable_objects(src, head)
    protected = _protected_in(dst, branch)
    total = len(manifests) + len(data)
    counts = {"copied": 0, "bytes_copied": 0, "skipped": 0, "bytes_skipped": 0}
    done = 0

    def copy(oid: str, context: str) -> None:
        nonlocal done
        copied, size = _copy_object(src, dst, oid, context, protected, verify_existing)
        key = "copied" if copied else "skipped"
        counts[key] += 1
        counts[f"bytes_{key}"] += size
        done += 1
        if progress is not None:
            progress(done, total)

    position = {oid: i for i, oid in enumerate(data)}
    copied_until = 0
    for sid in manifests:
        m = src.read_manifest(sid)
        chunk_objects = ref_objects(c for chain in m.key_groups.values() for c in chain)
        needed = chunk_objects + list(m.outputs)
        last = max((position[oid] for oid in needed), default=-1)
        while copied_until <= last:
            copy(data[copied_until], f"chunk or output of snapshot {sid}")
            copied_until += 1
        copy(sid, f"manifest of branch {branch}")
    name = f"heads/{branch}"
    current = dst.read_ref(name)
    previous = None if current is None else current.target
    moved = False
    if previous != head:
        if previous is not None and not force and not dst.is_ancestor(previous, head):
            raise BranchConflictError(
                name,
                previous,
                head,
                f"branch {branch!r} in the destination store is at {previous}, which is not in "
                f"the history of {head} being copied: the destination has commits the source "
                "lacks. Copy to another branch name, move or delete the destination branch, "
                "or pass force=True (its reflog keeps the old target)",
            )
        dst.cas_ref(
            name,
            previous,
            head,
            operation_id=operation_id,
            reason=reason or f"copy of {branch} from {src.backend.url}",
        )
        moved = True
    return CopyResult(
        branch=branch,
        snapshot_id=head,
        manifests=len(manifests),
        objects_copied=counts["copied"],
        bytes_copied=counts["bytes_copied"],
        objects_skipped=counts["skipped"],
        bytes_skipped=counts["bytes_skipped"],
        previous_target=previous,
        ref_moved=moved,
    )


def _protected_in(dst: Repository, branch: str) -> set[str]:
    """Objects reachable from the destination branch's current head (gc keeps them)."""
    current = dst.read_ref(f"heads/{branch}")
    if current is None:
        return set()
    try:
        manifests, data = reachable_objects(dst, current.target)
    except ObjectNotFoundError:
        return set()  # a damaged destination: refresh everything we copy
    return set(manifests) | set(data)


def _copy_object(
    src: Repository,
    dst: Repository,
    oid: str,
    context: str,
    protected: set[str],
    verify_existing: bool,
) -> tuple[bool, int]:
    """(copied?, stored size). Skips an object `dst` has unless it is old and unprotected."""
    key = object_key(oid)
    info = dst.backend.stat(key)
    if info is not None:
        fresh = datetime.now(UTC) - info.mtime < _REFRESH_AFTER
        if oid in protected or fresh:
            if not verify_existing:
                return False, info.size
            dst.get_object(oid)  # CorruptObjectError names it: repair dst, then re-run
            return False, info.size
    blob = src.backend.get(key)
    if blob is None:
        raise ObjectNotFoundError(oid, f"{context}, in the source store {src.backend.url}")
    decode(oid, blob.data)  # verifies kind header, length and content hash
    dst.backend.put(key, blob.data)
    return True, len(blob.data)


# -- reading and writing key-group state ---------------------------------------------------


def _key_columns(manifest: Manifest, key: str | Sequence[str] | None) -> list[str]:
    if key is not None:
        return [key] if isinstance(key, str) else list(key)
    recorded = manifest.extra.get("key")
    if isinstance(recorded, list) and recorded and all(isinstance(k, str) for k in recorded):
        return list(recorded)
    raise StateOperationError(
        "the snapshot does not record its key columns (manifest extra.key; snapshots written "
        "before the engine recorded them lack it): pass key='<column>' or key=('a', 'b') as "
        "the job declares it"
    )


def _load(repo: Repository, chain: Sequence[str], keys: Sequence[str]) -> pa.Table:
    return chunks.load_key_group(repo, chain, keys, use_cache=False).table


class _Bases:
    """New base chunks of key groups, written as packs (`Repository.put_chunks`) as they fill."""

    def __init__(self, repo: Repository) -> None:
        self.repo = repo
        self.chains: dict[int, tuple[str, ...]] = {}
        self.written = 0
        self._payloads: dict[int, bytes] = {}
        self._pending = 0

    def add(self, kg: int, table: pa.Table) -> None:
        payload = chunks.encode_table(chunks.with_deleted(table))
        self._payloads[kg] = payload
        self._pending += len(payload)
        self.written += len(payload)
        if self._pending >= PACK_BYTES:
            self.flush()

    def flush(self) -> dict[int, tuple[str, ...]]:
        self.chains.update((kg, (ref,)) for kg, ref in self.repo.put_chunks(self._payloads).items())
        self._payloads.clear()
        self._pending = 0
        return self.chains


def _carried_extra(source: Manifest, keys: Sequence[str], **more: Any) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if "job" in source.extra:
        extra["job"] = source.extra["job"]
    extra["key"] = list(keys)
    extra.update(more)
    return extra


def _equivalent(a: Manifest, b: Manifest) -> bool:
    """Equal commits apart from when they were made."""
    da, db = a.to_dict(), b.to_dict()
    da.pop("created_at")
    db.pop("created_at")
    return da == db


def _commit_on(
    repo: Repository,
    manifest: Manifest,
    branch: str,
    *,
    expected_head: str | None,
    operation_id: str | None,
    reason: str,
    what: str,
) -> str:
    """Commit `manifest` on `branch` by CAS from `expected_head`; a branch already at an
    equivalent commit (a retry after a CAS that succeeded) returns that commit."""
    name = f"heads/{branch}"
    current = repo.read_ref(name)
    if current is not None and _equivalent(repo.read_manifest(current.target), manifest):
        return current.target
    actual = None if current is None else current.target
    if actual != expected_head:
        raise BranchConflictError(
            name,
            expected_head,
            actual,
            _conflict_advice(branch, expected_head, actual, what),
        )
    try:
        return repo.commit(
            manifest, branch, expected_head=expected_head, operation_id=operation_id, reason=reason
        )
    except RefConflictError as exc:
        raise BranchConflictError(
            name,
            expected_head,
            exc.actual,
            _conflict_advice(branch, expected_head, exc.actual, what),
        ) from None


def _conflict_advice(branch: str, expected: str | None, actual: str | None, what: str) -> str:
    if expected is None:
        return (
            f"{what}: branch {branch!r} already exists (at {actual}); pick another branch "
            f"name, or pass expected_head={actual} to move it"
        )
    if actual is None:
        return (
            f"{what}: branch {branch!r} does not exist (expected at {expected}); pass "
            "expected_head=None to create it"
        )
    return (
        f"{what}: branch {branch!r} is at {actual}, not at {expected} as expected; another "
        "writer (a running job?) moved it: stop the job, re-read the branch and retry"
    )


# -- rehash ----------------------------------------------------------------------------------


def rehash(
    repo: Repository,
    snapshot_id: str,
    new_max_parallelism: int,
    *,
    branch: str,
    operation_id: str | None,
    reason: str,
    key: str | Sequence[str] | None = None,
    created_at: str | None = None,
) -> str:
    """Redistribute a snapshot's state over `new_max_parallelism` key groups and commit it.

    Every key group's chain is materialised with the engine's reader, every key's group is
    recomputed with the engine's hashing under the new M, and each new key group is written
    as one compacted base chunk (rows keep their order of the old key groups, so a re-run
    writes the same chunks). The commit is kind "migration", parent the snapshot, with the
    new M, parallelism min(old p, new M), the same offsets and no outputs (the branch's
    output is the union over its first-parent chain: the epochs before stay counted once).
    `branch` must be at the snapshot (or absent: it is created). Returns the new snapshot id;
    a re-run after a crash returns the same commit once it is on the branch.
    """
    check_max_parallelism(new_max_parallelism)
    source_id = repo.resolve(snapshot_id)
    source = repo.read_manifest(source_id)
    keys = _key_columns(source, key)
    tables = [_load(repo, chain, keys) for chain in source.key_groups.values()]
    tables = [t for t in tables if t.num_rows]
    new_groups: dict[int, tuple[str, ...]] = {}
    written = rows = 0
    if tables:
        state = pa.concat_tables(tables, promote_options="permissive")
        missing = [k for k in keys if k not in state.column_names]
        if missing:
            raise StateOperationError(
                f"the state of snapshot {source_id} has no key column(s) {missing} "
                f"(columns: {state.column_names}): pass the job's key as key=…"
            )
        groups = hash_key_groups([state.column(k) for k in keys], new_max_parallelism)
        order = np.argsort(groups, kind="stable")
        state = state.take(pa.array(order))
        values, starts, counts = np.unique(groups[order], return_index=True, return_counts=True)
        bases = _Bases(repo)
        for g, start, n in zip(values.tolist(), starts.tolist(), counts.tolist(), strict=True):
            bases.add(g, state.slice(start, n))
        new_groups, written = bases.flush(), bases.written
        rows = state.num_rows
    old_m = source.max_parallelism
    manifest = Manifest(
        branch=branch,
        epoch=source.epoch,
        parents=(source_id,),
        max_parallelism=new_max_parallelism,
        parallelism=min(source.parallelism, new_max_parallelism),
        kind="migration",
        key_groups=new_groups,
        outputs=(),
        offsets=source.offsets,
        code_version=source.code_version,
        config_hash=source.config_hash,
        operation_id=operation_id,
        created_at=created_at or format_timestamp(repo.now()),
        processing_time_ms=source.processing_time_ms,
        stats={"keys": rows, "key_groups": len(new_groups), "bytes_written": written},
        provenance={
            "operation": "rehash",
            "source_snapshot": source_id,
            "from_max_parallelism": str(old_m),
            "to_max_parallelism": str(new_max_parallelism),
            "reason": reason,
        },
        extra=_carried_extra(
            source, keys, migration={"type": "rehash", "from": old_m, "to": new_max_parallelism}
        ),
    )
    return _commit_on(
        repo,
        manifest,
        branch,
        expected_head=_head_for(repo, branch, source_id),
        operation_id=operation_id,
        reason=f"rehash M {old_m} -> {new_max_parallelism}: {reason}",
        what=f"rehash of {source_id}",
    )


def _head_for(repo: Repository, branch: str, source_id: str) -> str | None:
    """The expected head of a migration: the source snapshot, or None for a new branch."""
    current = repo.read_ref(f"heads/{branch}")
    return None if current is None else source_id


# -- transform -------------------------------------------------------------------------------


def load_migration(name: str) -> MigrationFn:
    """The migration function registered as entry point `name` (group
    ``epochal.state_migrations``) by an installed package."""
    try:
        value: Any = entry_points.load(entry_points.STATE_MIGRATIONS, name)
    except entry_points.EntryPointError as exc:
        raise MigrationError(str(exc)) from None
    if not callable(value):
        raise MigrationError(
            f"state migration {name!r} is a {type(value).__name__}, not a function "
            "taking and returning a pyarrow.Table"
        )
    fn: MigrationFn = value
    return fn


def transform_state(
    repo: Repository,
    snapshot_id: str,
    fn: MigrationFn | str,
    *,
    branch: str,
    operation_id: str | None,
    reason: str,
    key: str | Sequence[str] | None = None,
    created_at: str | None = None,
) -> str:
    """Apply a state migration `fn(pa.Table) -> pa.Table` (or the name of one registered
    as an entry point) to every key group's state and commit the result as kind "migration".

    `fn` sees one key group's materialised state (key columns and state columns, without the
    ``_deleted`` flag) and must return a table that keeps the key columns, with every key
    non-null, once, and still in that key group (adding, renaming or dropping state columns,
    changing values and dropping keys are fine). A violation raises `MigrationError` naming
    the key group, before anything is committed. Per-key-function state (``_state`` pickled
    dicts, ``_expires``) must keep exactly its columns. Key groups whose table comes back
    equal keep their chunks; an empty result drops the key group. Same commit rules as
    `rehash`: parent the snapshot, same M, p and offsets, no outputs.
    """
    ref = fn if isinstance(fn, str) else f"{fn.__module__}:{fn.__qualname__}"
    migrate = load_migration(fn) if isinstance(fn, str) else fn
    source_id = repo.resolve(snapshot_id)
    source = repo.read_manifest(source_id)
    keys = _key_columns(source, key)
    m = source.max_parallelism
    new_groups: dict[int, tuple[str, ...]] = {}
    changed = 0
    bases = _Bases(repo)
    for kg, chain in source.key_groups.items():
        table = _load(repo, chain, keys)
        try:
            result = migrate(table)
        except Exception as exc:
            raise MigrationError(
                f"migration {ref} failed on key group {kg} of snapshot {source_id}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        _check_result(result, table, keys, kg, m, ref)
        if result.equals(table):
            new_groups[kg] = tuple(chain)
            continue
        changed += 1
        if result.num_rows:
            bases.add(kg, result)
    new_groups.update(bases.flush())
    written = bases.written
    manifest = Manifest(
        branch=branch,
        epoch=source.epoch,
        parents=(source_id,),
        max_parallelism=m,
        parallelism=source.parallelism,
        kind="migration",
        key_groups=new_groups,
        outputs=(),
        offsets=source.offsets,
        code_version=source.code_version,
        config_hash=source.config_hash,
        operation_id=operation_id,
        created_at=created_at or format_timestamp(repo.now()),
        processing_time_ms=source.processing_time_ms,
        stats={"key_groups_changed": changed, "bytes_written": written},
        provenance={
            "operation": "transform_state",
            "source_snapshot": source_id,
            "function": ref,
            "reason": reason,
        },
        extra=_carried_extra(source, keys, migration={"type": "transform", "function": ref}),
    )
    return _commit_on(
        repo,
        manifest,
        branch,
        expected_head=_head_for(repo, branch, source_id),
        operation_id=operation_id,
        reason=f"state migration {ref}: {reason}",
        what=f"state migration of {source_id}",
    )


def _check_result(
    result: object, before: pa.Table, keys: Sequence[str], kg: int, m: int, ref: str
) -> None:
    where = f"migration {ref}, key group {kg}"
    if not isinstance(result, pa.Table):
        raise MigrationError(f"{where}: returned a {type(result).__name__}, not a pyarrow.Table")
    missing = [k for k in keys if k not in result.column_names]
    if missing:
        raise MigrationError(
            f"{where}: the result lacks key column(s) {missing}; a state migration must keep "
            "the key columns (rename state columns only)"
        )
    if chunks.DELETED in result.column_names:
        raise MigrationError(f"{where}: the result must not have a {chunks.DELETED!r} column")
    if STATE in before.column_names and result.column_names != before.column_names:
        raise MigrationError(
            f"{where}: per-key-function state must keep exactly the columns "
            f"{before.column_names} (got {result.column_names}); migrate the named states "
            "inside the pickled `_state` dicts instead"
        )
    if result.num_rows == 0:
        return
    for k in keys:
        if result.column(k).null_count:
            raise MigrationError(f"{where}: key column {k!r} has nulls; keys are never null")
    groups = hash_key_groups([result.column(k) for k in keys], m)
    wrong = np.flatnonzero(groups != kg)
    if len(wrong):
        example = result.select(list(keys)).slice(int(wrong[0]), 1).to_pylist()[0]
        raise MigrationError(
            f"{where}: {len(wrong)} key(s) no longer belong to key group {kg} under M={m} "
            f"(e.g. {example} hashes to key group {int(groups[wrong[0]])}); a state migration "
            "must not change keys — change M with rehash instead"
        )
    lookup = chunks.lookup_key(result, keys)
    if pc.count_distinct(lookup).as_py() != result.num_rows:
        raise MigrationError(f"{where}: the result lists a key more than once")


# -- commits that reuse a snapshot's state -------------------------------------------------


def new_branch_commit(
    repo: Repository,
    source_snapshot_id: str,
    branch: str,
    *,
    kind: str,
    operation_id: str | None,
    provenance: Mapping[str, str],
    code_version: str | None = None,
    config_hash: str | None = None,
    expected_head: str | None = None,
    created_at: str | None = None,
    parallelism: int | None = None,
    reason: str | None = None,
) -> str:
    """Commit a snapshot's state again on `branch`: a fork, rollback, rescale or savepoint.

    The commit has parent = the source snapshot, its key groups, offsets, epoch, M and (unless
    `parallelism` is given) p, `code_version` / `config_hash` when given (a fork with a new
    application version), the operation id, `provenance` (plus ``source_snapshot``), and no
    outputs — so the branch's output (union over its first-parent chain) is the source's
    history followed by later epochs, never counted twice. ``heads/<branch>`` moves by CAS
    from `expected_head` (None: the branch must not exist yet). Idempotent: when the branch is
    already at an equal commit (apart from `created_at`, which a retry may pass to write
    the identical manifest) its id is returned.
    """
    if kind not in BRANCH_COMMIT_KINDS:
        raise ValueError(f"kind must be one of {sorted(BRANCH_COMMIT_KINDS)}, not {kind!r}")
    source_id = repo.resolve(source_snapshot_id)
    source = repo.read_manifest(source_id)
    p = source.parallelism if parallelism is None else parallelism
    check_parallelism(p, source.max_parallelism)
    prov = {**dict(provenance), "source_snapshot": source_id}
    keys = source.extra.get("key")
    extra: dict[str, Any] = {k: source.extra[k] for k in ("job",) if k in source.extra}
    if isinstance(keys, list):
        extra["key"] = keys
    manifest = Manifest(
        branch=branch,
        epoch=source.epoch,
        parents=(source_id,),
        max_parallelism=source.max_parallelism,
        parallelism=p,
        kind=kind,
        key_groups=source.key_groups,
        outputs=(),
        offsets=source.offsets,
        code_version=source.code_version if code_version is None else code_version,
        config_hash=source.config_hash if config_hash is None else config_hash,
        operation_id=operation_id,
        created_at=created_at or format_timestamp(repo.now()),
        processing_time_ms=source.processing_time_ms,
        provenance=prov,
        extra=extra,
    )
    return _commit_on(
        repo,
        manifest,
        branch,
        expected_head=expected_head,
        operation_id=operation_id,
        reason=reason or f"{kind} from {source_id[:12]}",
        what=f"{kind} commit of {source_id}",
    )


def replay_problem(source: Source, manifest: Manifest) -> str | None:
    """Why `source` cannot replay from a snapshot's offsets (None: it can); see
    `Source.retained`. Check before a rollback, fork or restore from an old snapshot."""
    return source.retained(dict(manifest.offsets.get(source.name, {})))


__all__ = [
    "BRANCH_COMMIT_KINDS",
    "BranchConflictError",
    "CopyResult",
    "MigrationError",
    "StateOperationError",
    "copy_branch",
    "load_migration",
    "new_branch_commit",
    "reachable_objects",
    "rehash",
    "replay_problem",
    "transform_state",
]
