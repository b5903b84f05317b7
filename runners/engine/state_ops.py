"""State operations: the store-level primitives behind migrate, rehash, fork, rollback, rescale.

No Django and no Spark: the control plane calls these from Celery tasks. Each is idempotent
and safe to re-run after a crash: objects are content-addressed (writing one again writes
the same bytes), and the only commit point of each operation is one compare-and-swap of a
branch ref; a re-run that finds the branch already at an equal commit returns it. Each commit
is a *derived* manifest (`derived_manifest`): the source snapshot's epoch, offsets and
processing time, parent the source, no outputs. Copying a branch to another store is a store
maintenance function (`snapshots_store.branch_copy`).

- `rehash` changes the max parallelism M of a snapshot's state (a "migration" commit).
- `transform_state` applies a user migration function to every key group's state table
  (a "migration" commit); `load_migration` resolves one registered as an entry point.
- `new_branch_commit` commits a snapshot's state again on a branch (fork, rollback, rescale,
  savepoint) with provenance and no outputs, so a branch's output never double counts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runners import entry_points
from runners.engine.hashing import key_groups as hash_key_groups
from runners.engine.keygroups import check_max_parallelism, check_parallelism
from runners.engine.per_key import STATE
from runners.engine.sources import Source
from runners.engine.state.codec import DELETED, lookup_key
from runners.engine.state.restore import load_key_group
from runners.engine.state.writer import ChunkWriter
from snapshots_store import BranchConflictError, Manifest, RefConflictError, Repository
from snapshots_store.codec import format_timestamp

MigrationFn = Callable[[pa.Table], pa.Table]

#: kinds `new_branch_commit` makes (epochs and migrations have their own paths)
BRANCH_COMMIT_KINDS: Final = frozenset({"fork", "rollback", "rescale", "savepoint"})
#: what a commit of an existing snapshot's state carries of its ``extra``: the job, and its
#: event-time document (the watermark the next epoch applies: runners/engine/eventtime)
CARRIED_EXTRA: Final = ("job", "event_time", "timers")


class StateOperationError(RuntimeError):
    """A state operation cannot be done as asked; the message says what to do instead."""


class MigrationError(StateOperationError):
    """A migration function or reference is unusable, or its result breaks the state's rules."""


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
    return load_key_group(repo, chain, keys, use_cache=False).table


def derived_manifest(
    repo: Repository,
    source_id: str,
    source: Manifest,
    *,
    branch: str,
    kind: str,
    operation_id: str | None,
    provenance: Mapping[str, str],
    extra: dict[str, Any],
    key_groups: Mapping[int, Sequence[str]] | None = None,
    max_parallelism: int | None = None,
    parallelism: int | None = None,
    code_version: str | None = None,
    config_hash: str | None = None,
    stats: Mapping[str, int | float] | None = None,
    created_at: str | None = None,
) -> Manifest:
    """A commit made from snapshot `source_id` (`source`) by a state operation rather than
    an epoch: parent the source, its epoch, offsets and processing time, no outputs (the
    branch's output is the union over its first-parent chain, so the epochs before stay
    counted once); every other field the source's unless given. `provenance` gains
    ``source_snapshot``."""
    return Manifest(
        branch=branch,
        epoch=source.epoch,
        parents=(source_id,),
        max_parallelism=source.max_parallelism if max_parallelism is None else max_parallelism,
        parallelism=source.parallelism if parallelism is None else parallelism,
        kind=kind,
        key_groups=source.key_groups if key_groups is None else key_groups,
        outputs=(),
        offsets=source.offsets,
        code_version=source.code_version if code_version is None else code_version,
        config_hash=source.config_hash if config_hash is None else config_hash,
        operation_id=operation_id,
        created_at=created_at or format_timestamp(repo.now()),
        processing_time_ms=source.processing_time_ms,
        stats={} if stats is None else dict(stats),
        provenance={**dict(provenance), "source_snapshot": source_id},
        extra=extra,
    )


def _carried_extra(source: Manifest, keys: Sequence[str] | None, **more: Any) -> dict[str, Any]:
    """The source's `CARRIED_EXTRA`, the key columns (None: the source's, if recorded) and
    `more`."""
    extra: dict[str, Any] = {k: source.extra[k] for k in CARRIED_EXTRA if k in source.extra}
    if keys is not None:
        extra["key"] = list(keys)
    elif isinstance(source.extra.get("key"), list):
        extra["key"] = source.extra["key"]
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
        with ChunkWriter(repo) as writer:
            for g, start, n in zip(values.tolist(), starts.tolist(), counts.tolist(), strict=True):
                writer.write_base(g, state.slice(start, n))
            new_groups = dict(writer.prepare())
        written, rows = writer.bytes_written, state.num_rows
    old_m = source.max_parallelism
    manifest = derived_manifest(
        repo,
        source_id,
        source,
        branch=branch,
        kind="migration",
        operation_id=operation_id,
        key_groups=new_groups,
        max_parallelism=new_max_parallelism,
        parallelism=min(source.parallelism, new_max_parallelism),
        stats={"keys": rows, "key_groups": len(new_groups), "bytes_written": written},
        provenance={
            "operation": "rehash",
            "from_max_parallelism": str(old_m),
            "to_max_parallelism": str(new_max_parallelism),
            "reason": reason,
        },
        extra=_carried_extra(
            source, keys, migration={"type": "rehash", "from": old_m, "to": new_max_parallelism}
        ),
        created_at=created_at,
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
    with ChunkWriter(repo) as writer:
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
                writer.write_base(kg, result)
        new_groups.update(writer.prepare())
    written = writer.bytes_written
    manifest = derived_manifest(
        repo,
        source_id,
        source,
        branch=branch,
        kind="migration",
        operation_id=operation_id,
        key_groups=new_groups,
        stats={"key_groups_changed": changed, "bytes_written": written},
        provenance={"operation": "transform_state", "function": ref, "reason": reason},
        extra=_carried_extra(source, keys, migration={"type": "transform", "function": ref}),
        created_at=created_at,
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
    if DELETED in result.column_names:
        raise MigrationError(f"{where}: the result must not have a {DELETED!r} column")
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
    lookup = lookup_key(result, keys)
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
    manifest = derived_manifest(
        repo,
        source_id,
        source,
        branch=branch,
        kind=kind,
        operation_id=operation_id,
        parallelism=p,
        code_version=code_version,
        config_hash=config_hash,
        provenance=provenance,
        extra=_carried_extra(source, None),
        created_at=created_at,
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
    "MigrationError",
    "StateOperationError",
    "derived_manifest",
    "load_migration",
    "new_branch_commit",
    "rehash",
    "replay_problem",
    "transform_state",
]
