"""Reads of a snapshot's keyed state from the store: sizes per key group, one key's state.

A snapshot's manifest maps each key group to its chunk chain (a base chunk, then deltas).
The stored size of a key group is the sum of its chunks' sizes; the state of one key is found
by hashing the key to its key group (the engine's `key_group_of`, with the snapshot's M) and
materialising only that group's chain, as the engine does. Chunks are immutable, so their
sizes are cached per process.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from controlplane.applications.models import Application
from controlplane.errors import InvalidRequest, NotFound
from controlplane.jobs.store import application_repository
from runners.engine.keygroups import key_group_of, operator_index
from runners.engine.keys import UnsupportedKeyError
from runners.engine.repos import repository as shared_repository
from runners.engine.state.restore import load_key_group
from snapshots_store import Manifest, Repository, StoreError

_SIZE_CACHE_ENTRIES = 200_000
_sizes: OrderedDict[str, int] = OrderedDict()
_lock = threading.Lock()


def repository(application: Application) -> Repository:
    """One Repository per (store, namespace) per process, so its manifest cache is shared."""
    return shared_repository(
        application.effective_store_url,
        application.store_namespace,
        lambda: application_repository(application),
    )


def read_manifest(application: Application, snapshot_id: str) -> Manifest:
    """The stored manifest; NotFound in words when the store cannot give it."""
    try:
        return repository(application).read_manifest(snapshot_id)
    except StoreError as exc:
        raise NotFound(
            f"snapshot {snapshot_id[:12]} cannot be read from the store of "
            f"{application.name} ({exc}); it may have been collected by gc, or the store is "
            "unreachable",
            code="manifest_unavailable",
        ) from None


def object_size(repo: Repository, object_id: str) -> int | None:
    with _lock:
        size = _sizes.get(object_id)
    if size is not None:
        return size
    stored = repo.chunk_size(object_id)  # a loose chunk or a pack member
    if stored is None:
        return None
    with _lock:
        _sizes[object_id] = stored
        while len(_sizes) > _SIZE_CACHE_ENTRIES:
            _sizes.popitem(last=False)
    return stored


@dataclass(frozen=True)
class KeyGroupSizes:
    """Stored bytes and chunk counts of every key group 0..M-1 of one snapshot."""

    snapshot_id: str
    max_parallelism: int
    parallelism: int
    bytes: list[int]
    chunks: list[int]
    missing: int  # chunks the store does not have (collected or lost)

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes)

    def per_task(self, parallelism: int | None = None) -> list[int]:
        """Stored bytes owned by each task at `parallelism` (default: the snapshot's)."""
        p = parallelism or self.parallelism
        totals = [0] * p
        for group, size in enumerate(self.bytes):
            totals[operator_index(group, p, self.max_parallelism)] += size
        return totals


def key_group_sizes(*, application: Application, snapshot_id: str) -> KeyGroupSizes:
    manifest = read_manifest(application, snapshot_id)
    repo = repository(application)
    m = manifest.max_parallelism
    sizes, counts, missing = [0] * m, [0] * m, 0
    for group, chain in manifest.key_groups.items():
        counts[group] = len(chain)
        for chunk_id in chain:
            size = object_size(repo, chunk_id)
            if size is None:
                missing += 1
            else:
                sizes[group] += size
    return KeyGroupSizes(snapshot_id, m, manifest.parallelism, sizes, counts, missing)


@dataclass(frozen=True)
class KeyState:
    """The state rows of one key at one snapshot (`rows` empty: the key holds no state)."""

    snapshot_id: str
    key: Any
    key_columns: tuple[str, ...]
    key_group: int
    task: int
    parallelism: int
    chunk_count: int
    rows: list[dict[str, Any]]

    @property
    def found(self) -> bool:
        return bool(self.rows)


def _candidates(text: str, key_columns: Sequence[str]) -> list[Any]:
    """The key values `text` may mean: a string, else also an integer; a JSON array for a key
    of several columns."""
    if len(key_columns) > 1:
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if not isinstance(value, list) or len(value) != len(key_columns):
            raise InvalidRequest(
                f"the key has {len(key_columns)} columns ({', '.join(key_columns)}): write it "
                'as a JSON array, e.g. ["a", 1]',
                fields={"key": ["a JSON array with one value per key column"]},
            )
        return [tuple(value)]
    found: list[Any] = [text]
    with contextlib.suppress(ValueError):
        found.append(int(text))
    return found


def _matches(table: pa.Table, key_columns: Sequence[str], key: Any) -> list[dict[str, Any]]:
    if not all(name in table.column_names for name in key_columns):
        return []
    wanted = key if isinstance(key, tuple) else (key,)
    columns = [table.column(name).to_pylist() for name in key_columns]
    picks = [i for i in range(table.num_rows) if tuple(c[i] for c in columns) == wanted]
    return table.take(picks).to_pylist() if picks else []


def key_state_at(*, application: Application, snapshot_id: str, key: str) -> KeyState:
    """The state of `key` at the snapshot: its key group, owning task and rows."""
    text = key.strip()
    if not text:
        raise InvalidRequest("type a key to look up", fields={"key": ["required"]})
    manifest = read_manifest(application, snapshot_id)
    recorded = manifest.extra.get("key")
    if not isinstance(recorded, list) or not recorded:
        raise InvalidRequest(
            f"snapshot {snapshot_id[:12]} does not record its key columns (written before the "
            "engine recorded them), so a key cannot be located in it",
            code="no_key_columns",
        )
    key_columns = tuple(str(c) for c in recorded)
    repo = repository(application)
    m, p = manifest.max_parallelism, manifest.parallelism
    first: KeyState | None = None
    for candidate in _candidates(text, key_columns):
        try:
            group = key_group_of(candidate, m)
        except UnsupportedKeyError as exc:
            raise InvalidRequest(str(exc), fields={"key": [str(exc)]}) from None
        chain = tuple(manifest.key_groups.get(group, ()))
        rows: list[dict[str, Any]] = []
        if chain:
            try:
                table = load_key_group(repo, chain, key_columns, use_cache=False).table
            except StoreError as exc:
                raise NotFound(
                    f"key group {group} of snapshot {snapshot_id[:12]} cannot be read ({exc}); "
                    "run `python -m snapshots_store fsck` on the store",
                    code="state_unavailable",
                ) from None
            rows = _matches(table, key_columns, candidate)
        state = KeyState(
            snapshot_id=snapshot_id,
            key=candidate,
            key_columns=key_columns,
            key_group=group,
            task=operator_index(group, p, m),
            parallelism=p,
            chunk_count=len(chain),
            rows=rows,
        )
        if state.found:
            return state
        first = first or state
    assert first is not None
    return first
