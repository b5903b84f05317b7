"""Commits the control plane writes itself: metadata-only snapshots that reuse existing state.

Thanks to key groups, a rescale, a rollback or a fork moves no state: the new manifest lists
the same key-group chunks and source offsets as the snapshot it grows from, with a new kind,
parallelism or branch, no sink outputs (so a branch's output, the union over its first
parents, never counts an epoch twice), and provenance saying who asked and why. The caller
passes `created_at` remembered from the first attempt, so a retried phase writes the identical
manifest and the commit is a no-op.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from controlplane.errors import Conflict
from snapshots_store import ControlConflictError, Manifest, RefConflictError, Repository


def derived_commit(
    repo: Repository,
    source_id: str,
    branch: str,
    *,
    kind: str,
    expected_head: str | None,
    operation_id: str,
    created_at: str,
    reason: str,
    provenance: Mapping[str, str],
    parallelism: int | None = None,
    code_version: str | None = None,
) -> str:
    """Commit a manifest that reuses `source_id`'s state on `branch` (CAS from expected_head);
    the engine's `new_branch_commit`, with a moved branch reported as a Conflict."""
    from runners.engine.state_ops import new_branch_commit

    try:
        return new_branch_commit(
            repo,
            source_id,
            branch,
            kind=kind,
            operation_id=operation_id,
            provenance={k: str(v) for k, v in provenance.items()},
            code_version=code_version,
            expected_head=expected_head,
            created_at=created_at,
            parallelism=parallelism,
            reason=reason,
        )
    except RefConflictError as exc:
        raise Conflict(
            f"branch {branch!r} moved to {exc.actual} while the operation ran (expected "
            f"{expected_head}); something else writes to it — stop that writer and retry",
            code="branch_moved",
        ) from None


def initial_commit(
    repo: Repository,
    branch: str,
    *,
    max_parallelism: int,
    parallelism: int,
    operation_id: str,
    created_at: str,
    code_version: str = "",
) -> str:
    """The empty initial snapshot of a new branch (idempotent)."""
    manifest = Manifest(
        branch=branch,
        epoch=0,
        max_parallelism=max_parallelism,
        parallelism=parallelism,
        kind="initial",
        operation_id=operation_id,
        created_at=created_at,
        code_version=code_version,
    )
    snapshot_id = repo.write_manifest(manifest)
    head = repo.read_ref(f"heads/{branch}")
    if head is not None:
        if head.target == snapshot_id:
            return snapshot_id
        raise Conflict(f"branch {branch!r} exists already", code="branch_exists")
    return repo.commit(
        manifest, branch, expected_head=None, operation_id=operation_id, reason="initial snapshot"
    )


def update_control(repo: Repository, branch: str, changes: Mapping[str, Any]) -> dict[str, Any]:
    """Merge `changes` into the branch's control document by CAS (None values remove keys)."""
    for _ in range(20):
        doc, version = repo.read_control(branch)
        new = {**doc, **changes}
        for key, value in changes.items():
            if value is None:
                new.pop(key, None)
        if new == doc:
            return doc
        try:
            repo.write_control(branch, new, version)
            return new
        except ControlConflictError:
            time.sleep(0.05)
    raise Conflict(
        f"the control document of branch {branch!r} kept changing; retry the operation",
        code="control_busy",
    )


def tag_snapshot(
    repo: Repository, name: str, snapshot_id: str, *, operation_id: str, reason: str
) -> None:
    """Create tag `name` at `snapshot_id`; fine when it already points there."""
    current = repo.read_ref(f"tags/{name}")
    if current is not None:
        if current.target == snapshot_id:
            return
        raise Conflict(
            f"tag {name!r} exists and points at {current.target[:12]}; choose another name",
            code="tag_exists",
        )
    try:
        repo.cas_ref(f"tags/{name}", None, snapshot_id, operation_id=operation_id, reason=reason)
    except RefConflictError as exc:
        if exc.actual != snapshot_id:
            raise Conflict(f"tag {name!r} was created concurrently", code="tag_exists") from None
