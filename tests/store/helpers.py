"""Small builders shared by the store tests."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from snapshots_store import Manifest, Repository
from snapshots_store.codec import format_timestamp

BASE_TIME = datetime(2026, 1, 1, tzinfo=UTC)


def listing(root: Path) -> dict[str, bytes]:
    """Every file under a local store root (lock files included) with its bytes."""
    result: dict[str, bytes] = {}
    if not root.exists():
        return result
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            result[path.relative_to(root).as_posix()] = path.read_bytes()
    return result


def manifest(
    *,
    branch: str = "main",
    epoch: int = 0,
    parents: tuple[str, ...] = (),
    key_groups: Mapping[int, Sequence[str]] | None = None,
    offsets: dict[str, dict[str, int]] | None = None,
    created_at: datetime | None = None,
    kind: str | None = None,
    max_parallelism: int = 16,
) -> Manifest:
    return Manifest(
        branch=branch,
        epoch=epoch,
        parents=parents,
        max_parallelism=max_parallelism,
        parallelism=2,
        kind=kind or ("initial" if not parents else "epoch"),
        key_groups=key_groups or {},
        offsets=offsets or {},
        created_at=format_timestamp(created_at or BASE_TIME + timedelta(seconds=epoch)),
    )


def commit_chain(repo: Repository, n: int, *, branch: str = "main") -> list[str]:
    """n commits on `branch`, each with one changed key group; returns their ids."""
    ids: list[str] = []
    head: str | None = None
    for epoch in range(n):
        chunk = repo.put_object("chunk", f"{branch}-{epoch}".encode())
        out = repo.put_object("output", f"out-{branch}-{epoch}".encode())
        m = manifest(
            branch=branch,
            epoch=epoch,
            parents=(head,) if head else (),
            key_groups={epoch % 16: [chunk]},
            offsets={"src": {"0": epoch * 10}},
        ).with_changes(outputs=(out,))
        head = repo.commit(m, branch, expected_head=head, reason=f"epoch {epoch}")
        ids.append(head)
    return ids
