"""Walks over the commit graph: log, ancestors, is_ancestor, merge base.

Every function takes `load(snapshot_id) -> Manifest` (normally `Repository.read_manifest`,
which caches), so the walks know nothing about storage. Snapshots may have any number of
parents. Where an order is needed, "newer" means a later `created_at`, ties broken by the
smaller id, so results are deterministic.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta

from snapshots_store.codec import parse_timestamp
from snapshots_store.manifest import Manifest

Loader = Callable[[str], Manifest]
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def age_key(snapshot_id: str, manifest: Manifest) -> tuple[int, str]:
    """Sort key putting newer snapshots first: (-created_at in µs, id)."""
    micros = (parse_timestamp(manifest.created_at) - _EPOCH) // timedelta(microseconds=1)
    return (-micros, snapshot_id)


def first_parent_log(
    load: Loader, start: str, limit: int | None = None
) -> Iterator[tuple[str, Manifest]]:
    """`start`, its first parent, that one's first parent … (the branch's own history)."""
    current: str | None = start
    count = 0
    while current is not None and (limit is None or count < limit):
        manifest = load(current)
        yield current, manifest
        count += 1
        current = manifest.parents[0] if manifest.parents else None


def ancestors(load: Loader, starts: Iterable[str]) -> set[str]:
    """Every snapshot reachable from `starts` through parents, the starts included."""
    seen: set[str] = set()
    queue = deque(starts)
    while queue:
        current = queue.popleft()
        if current in seen:
            continue
        seen.add(current)
        queue.extend(p for p in load(current).parents if p not in seen)
    return seen


def topo_log(load: Loader, start: str, limit: int | None = None) -> Iterator[tuple[str, Manifest]]:
    """All ancestors of `start`, every child before its parents, newest first among the ready.

    Exact topological order needs the whole history of `start` first (one manifest read per
    snapshot); use `first_parent_log` when a cheap streaming walk is enough.
    """
    parents: dict[str, tuple[str, ...]] = {}
    keys: dict[str, tuple[int, str]] = {}
    pending_children: dict[str, int] = {}
    stack = [start]
    while stack:
        current = stack.pop()
        if current in parents:
            continue
        manifest = load(current)
        parents[current] = tuple(manifest.parents)
        keys[current] = age_key(current, manifest)
        for parent in manifest.parents:
            pending_children[parent] = pending_children.get(parent, 0) + 1
            if parent not in parents:
                stack.append(parent)
    ready = [(keys[start], start)]
    emitted = 0
    while ready and (limit is None or emitted < limit):
        _, current = heapq.heappop(ready)
        yield current, load(current)
        emitted += 1
        for parent in parents[current]:
            pending_children[parent] -= 1
            if pending_children[parent] == 0:
                heapq.heappush(ready, (keys[parent], parent))


def log(
    load: Loader, start: str, *, first_parent: bool = False, limit: int | None = None
) -> Iterator[tuple[str, Manifest]]:
    """History of `start`: the first-parent chain, or the full graph in topological order."""
    if limit is not None and limit < 0:
        raise ValueError("limit must be >= 0")
    if first_parent:
        return first_parent_log(load, start, limit)
    return topo_log(load, start, limit)


def is_ancestor(load: Loader, ancestor: str, descendant: str) -> bool:
    """True when `ancestor` is in the history of `descendant` (a snapshot is its own)."""
    seen: set[str] = set()
    queue = deque([descendant])
    while queue:
        current = queue.popleft()
        if current == ancestor:
            return True
        if current in seen:
            continue
        seen.add(current)
        queue.extend(p for p in load(current).parents if p not in seen)
    return False


def merge_bases(load: Loader, a: str, b: str) -> list[str]:
    """The best common ancestors of `a` and `b` (none is an ancestor of another), newest first."""
    common = ancestors(load, [a]) & ancestors(load, [b])
    if not common:
        return []
    dominated = ancestors(load, [p for c in common for p in load(c).parents])
    best = common - dominated
    return sorted(best, key=lambda s: age_key(s, load(s)))


def merge_base(load: Loader, a: str, b: str) -> str | None:
    """The newest best common ancestor of `a` and `b`, or None when they share no history."""
    bases = merge_bases(load, a, b)
    return bases[0] if bases else None
