"""Lineage reads that need the store rather than the index: manifest-only fields and diffs."""

from __future__ import annotations

from typing import Any

from controlplane.applications.models import Application
from controlplane.errors import InvalidRequest
from controlplane.jobs.store import application_repository
from controlplane.lineage.models import Snapshot
from snapshots_store import StoreError
from snapshots_store.diff import SnapshotDiff


def snapshot_manifest_extras(
    *, application: Application, snapshot_id: str
) -> dict[str, Any] | None:
    """What only the stored manifest holds (key groups, outputs, processing time, extra);
    None when the store cannot give it (collected by gc, store unreachable)."""
    try:
        manifest = application_repository(application).read_manifest(snapshot_id)
    except StoreError:
        return None
    return {
        "key_groups": len(manifest.key_groups),
        "state_chunks": sum(len(chunks) for chunks in manifest.key_groups.values()),
        "outputs": list(manifest.outputs),
        "processing_time_ms": manifest.processing_time_ms,
        "extra": dict(manifest.extra),
    }


def snapshot_diff(
    *, application: Application, snapshot: Snapshot, against: str | None = None
) -> SnapshotDiff:
    """Differences from `against` (default: the first parent) to `snapshot`, from the store."""
    if against is None:
        if not snapshot.parent_ids:
            raise InvalidRequest(
                f"snapshot {snapshot.snapshot_id[:12]} is a root and has no parent to diff "
                "against; pass ?against=REV",
                code="no_parent",
                fields={"against": ["required for a root snapshot"]},
            )
        against = snapshot.parent_ids[0]
    return application_repository(application).diff(against, snapshot.snapshot_id)
