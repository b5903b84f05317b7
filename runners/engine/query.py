"""Queryable state at any epoch: read a key's (or a key range's, or a key group's) state at a
snapshot, straight from the store through the chunk cache (see docs/webs.md).

A committed snapshot never changes (its manifest and chunks are immutable, named by their
hashes), so a query at a snapshot — or at a committed epoch of a branch, which names one
snapshot — always gives the same answer (queries made idempotent by running them in the context
of an epoch, as in van Kaam, "Epoch alignment in stateful streams"). A query for an epoch the
branch has not committed yet waits up to `timeout` seconds for it and then answers "pending",
never with partial state. A cross-job query "as of my epoch m" is translated through the mapping
the downstream's manifests record (`branch_source.upstream_epoch_at`)."""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from runners.engine.branch_source import upstream_epoch_at
from runners.engine.keygroups import key_group_of
from runners.engine.per_key import EXPIRES, STATE
from runners.engine.state.codec import lookup_key
from runners.engine.state.restore import load_key_group
from snapshots_store import Manifest, Repository

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


class StateQueryError(ValueError):
    """A query the store cannot answer as asked (unknown epoch, bad key, bad range)."""


@dataclass(frozen=True)
class StateAnswer:
    """The state rows a query found at one snapshot (``status`` "ok"), or "pending"."""

    status: str
    snapshot_id: str | None = None
    epoch: int | None = None
    branch: str | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    key_groups: list[int] = field(default_factory=list)
    next_cursor: str | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "status": self.status,
            "snapshot_id": self.snapshot_id,
            "epoch": self.epoch,
            "branch": self.branch,
            "rows": self.rows,
            "key_groups": self.key_groups,
            "next_cursor": self.next_cursor,
        }
        if self.detail:
            doc["detail"] = self.detail
        return doc


def key_columns_of(manifest: Manifest) -> list[str]:
    keys = manifest.extra.get("key")
    if not isinstance(keys, list) or not keys:
        raise StateQueryError(
            "the snapshot does not record its key columns (extra.key); it predates them"
        )
    return [str(k) for k in keys]


def _plain(value: Any) -> Any:
    """A JSON-friendly form of a state value."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return repr(value)


def _rows(table: pa.Table, now_ms: int) -> list[dict[str, Any]]:
    """State rows as plain dicts: aggregate columns as they are (internal ones dropped); a
    per-key function's pickled states decoded into ``state: {name: value}``, without the
    entries expired at the snapshot's processing time (what the job itself would read)."""
    rows = []
    for row in table.to_pylist():
        out: dict[str, Any] = {}
        for name, value in row.items():
            if name == STATE:
                entries = pickle.loads(value) if value else {}
                out["state"] = {
                    n: _plain(e[1])
                    for n, e in sorted(entries.items())
                    if e[2] is None or e[2] > now_ms
                }
            elif name == EXPIRES or name.startswith("_"):
                continue
            else:
                out[name] = _plain(value)
        rows.append(out)
    return rows


def _load(repo: Repository, manifest: Manifest, kg: int, keys: Sequence[str]) -> pa.Table | None:
    chain = manifest.key_groups.get(kg)
    if not chain:
        return None
    return load_key_group(repo, chain, keys).table


def state_at(
    repo: Repository,
    snapshot: str,
    *,
    key: Any = None,
    key_group: int | None = None,
    key_from: Any = None,
    key_to: Any = None,
    limit: int = DEFAULT_LIMIT,
    cursor: str | None = None,
    branch: str | None = None,
) -> StateAnswer:
    """The state at `snapshot` (any revision) of one `key` (a value, or a tuple for several
    key columns), of one `key_group` (a page of `limit` rows from `cursor`), or of the keys
    in ``[key_from, key_to)`` (single key column; a page over the key groups in order).
    Without any of these: no rows, and the key groups that hold state at the snapshot."""
    snapshot_id = repo.resolve(snapshot)
    manifest = repo.read_manifest(snapshot_id)
    limit = max(1, min(int(limit), MAX_LIMIT))
    answer: dict[str, Any] = {
        "status": "ok",
        "snapshot_id": snapshot_id,
        "epoch": manifest.epoch,
        "branch": branch or manifest.branch,
    }
    if key is None and key_group is None and key_from is None and key_to is None:
        # no selector: what can be asked at this snapshot (its non-empty key groups)
        return StateAnswer(key_groups=sorted(manifest.key_groups), **answer)
    keys = key_columns_of(manifest)
    if key is not None:
        return _one_key(repo, manifest, keys, key, answer)
    if key_group is not None:
        return _one_key_group(repo, manifest, keys, key_group, limit, cursor, answer)
    if len(keys) != 1:
        raise StateQueryError("key ranges need a single key column")
    return _key_range(repo, manifest, keys[0], key_from, key_to, limit, cursor, answer)


def _one_key(
    repo: Repository, manifest: Manifest, keys: list[str], key: Any, answer: dict[str, Any]
) -> StateAnswer:
    value = tuple(key) if isinstance(key, list) else key
    if len(keys) > 1 and not (isinstance(value, tuple) and len(value) == len(keys)):
        raise StateQueryError(f"the key has {len(keys)} columns {keys}: give one value each")
    kg = key_group_of(value, manifest.max_parallelism)
    table = _load(repo, manifest, kg, keys)
    rows: list[dict[str, Any]] = []
    if table is not None and table.num_rows:
        probe = pa.table(
            {c: [v] for c, v in zip(keys, value if len(keys) > 1 else (value,), strict=True)}
        )
        try:
            probe = probe.cast(table.select(keys).schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise StateQueryError(f"key {value!r} does not fit the key: {exc}") from None
        hit = pc.is_in(lookup_key(table, keys), lookup_key(probe, keys))
        rows = _rows(table.filter(hit), manifest.processing_time_ms)
    return StateAnswer(rows=rows, key_groups=[kg], **answer)


def _one_key_group(
    repo: Repository,
    manifest: Manifest,
    keys: list[str],
    key_group: int,
    limit: int,
    cursor: str | None,
    answer: dict[str, Any],
) -> StateAnswer:
    start = 0 if cursor is None else _cursor(cursor)
    m = manifest.max_parallelism
    if not 0 <= key_group < m:
        raise StateQueryError(f"key group {key_group} is outside 0..{m - 1}")
    table = _load(repo, manifest, key_group, keys)
    if table is None:
        return StateAnswer(key_groups=[key_group], **answer)
    table = table.sort_by([(c, "ascending") for c in keys])
    page = table.slice(start, limit)
    more = start + limit < table.num_rows
    return StateAnswer(
        rows=_rows(page, manifest.processing_time_ms),
        key_groups=[key_group],
        next_cursor=f"{start + limit}" if more else None,
        **answer,
    )


def _key_range(
    repo: Repository,
    manifest: Manifest,
    key: str,
    key_from: Any,
    key_to: Any,
    limit: int,
    cursor: str | None,
    answer: dict[str, Any],
) -> StateAnswer:
    """Every key group in order from the cursor's group, `limit` rows per page; the cursor
    is "<key group>:<row offset in its sorted matches>"."""
    m, now = manifest.max_parallelism, manifest.processing_time_ms
    group, skip = (0, 0) if cursor is None else _range_cursor(cursor)
    found: list[dict[str, Any]] = []
    visited: list[int] = []
    for kg in range(group, m):
        table = _load(repo, manifest, kg, [key])
        visited.append(kg)
        if table is None or not table.num_rows:
            skip = 0
            continue
        column = table.column(key)
        mask = None
        if key_from is not None:
            mask = pc.greater_equal(column, pa.scalar(key_from, column.type))
        if key_to is not None:
            below = pc.less(column, pa.scalar(key_to, column.type))
            mask = below if mask is None else pc.and_(mask, below)
        matches = table.filter(mask).sort_by([(key, "ascending")])
        take = matches.slice(skip, limit - len(found))
        found.extend(_rows(take, now))
        if len(found) >= limit:
            consumed = skip + take.num_rows
            nxt = f"{kg}:{consumed}" if consumed < matches.num_rows else f"{kg + 1}:0"
            done = consumed >= matches.num_rows and kg + 1 >= m
            return StateAnswer(
                rows=found, key_groups=visited, next_cursor=None if done else nxt, **answer
            )
        skip = 0
    return StateAnswer(rows=found, key_groups=visited, **answer)


def _cursor(raw: str) -> int:
    if not raw.isdigit():
        raise StateQueryError(f"cursor {raw!r} is not one this endpoint gave")
    return int(raw)


def _range_cursor(raw: str) -> tuple[int, int]:
    a, sep, b = raw.partition(":")
    if not sep or not a.isdigit() or not b.isdigit():
        raise StateQueryError(f"cursor {raw!r} is not one this endpoint gave")
    return int(a), int(b)


def epoch_snapshot(repo: Repository, branch: str, epoch: int) -> str | None:
    """The snapshot of `branch` that committed `epoch` (the commit on its first-parent chain
    that processed it); None when the branch has not reached it yet. StateQueryError when the
    branch went past `epoch` without it (it cannot appear any more)."""
    if repo.read_ref(f"heads/{branch}") is None:
        return None
    chain = list(repo.log(f"heads/{branch}", first_parent=True))
    if chain[0][1].epoch < epoch:
        return None
    for i, (sid, manifest) in enumerate(chain):
        parent_epoch = chain[i + 1][1].epoch if i + 1 < len(chain) else 0
        if manifest.epoch == epoch and parent_epoch < epoch:
            return sid
        if manifest.epoch < epoch:
            break
    raise StateQueryError(f"branch {branch!r} has no epoch {epoch} on its history")


def epoch_in_history(repo: Repository, rev: str, epoch: int) -> str:
    """The snapshot in the first-parent history of revision `rev` that committed `epoch`;
    StateQueryError when that history has no such epoch (it ends before, or skipped it)."""
    if epoch < 1:
        raise StateQueryError("epochs start at 1")
    chain = list(repo.log(rev, first_parent=True))
    if chain[0][1].epoch < epoch:
        raise StateQueryError(
            f"{rev!r} is at epoch {chain[0][1].epoch}; epoch {epoch} comes after it"
        )
    for i, (sid, manifest) in enumerate(chain):
        parent_epoch = chain[i + 1][1].epoch if i + 1 < len(chain) else 0
        if manifest.epoch == epoch and parent_epoch < epoch:
            return sid
        if manifest.epoch < epoch:
            break
    raise StateQueryError(f"{rev!r} has no epoch {epoch} in its history")


def wait_for_epoch(
    repo: Repository,
    branch: str,
    epoch: int,
    *,
    timeout: float = 0.0,
    poll: float = 0.2,
    sleep: Callable[[float], None] = time.sleep,
) -> str | None:
    """The snapshot of `epoch` on `branch`, waiting up to `timeout` seconds for its commit."""
    deadline = time.monotonic() + max(0.0, timeout)
    while True:
        sid = epoch_snapshot(repo, branch, epoch)
        if sid is not None or time.monotonic() >= deadline:
            return sid
        sleep(min(poll, max(0.0, deadline - time.monotonic())))


def state_at_epoch(
    repo: Repository, branch: str, epoch: int, *, timeout: float = 0.0, **query: Any
) -> StateAnswer:
    """`state_at` the snapshot that committed `epoch` on `branch`; "pending" when it is not
    committed within `timeout` seconds."""
    if epoch < 1:
        raise StateQueryError("epochs start at 1")
    sid = wait_for_epoch(repo, branch, epoch, timeout=timeout)
    if sid is None:
        head = repo.read_ref(f"heads/{branch}")
        have = 0 if head is None else repo.read_manifest(head.target).epoch
        return StateAnswer(
            status="pending",
            epoch=epoch,
            branch=branch,
            detail=f"branch {branch!r} has committed epoch {have}; epoch {epoch} is not "
            "committed yet — ask again later",
        )
    return state_at(repo, sid, branch=branch, **query)


def state_as_of(
    repo: Repository,
    branch: str,
    *,
    caller: Repository,
    caller_branch: str,
    caller_epoch: int,
    caller_source: str = "upstream",
    timeout: float = 0.0,
    **query: Any,
) -> StateAnswer:
    """A cross-job query: the state of this (upstream) job "as of" the caller's epoch
    `caller_epoch`, i.e. at the upstream epoch the caller's epoch had read up to (its
    mapping). Pending while the caller's epoch is not committed."""
    sid = wait_for_epoch(caller, caller_branch, caller_epoch, timeout=timeout)
    if sid is None:
        return StateAnswer(
            status="pending",
            branch=branch,
            detail=f"the caller's epoch {caller_epoch} is not committed yet",
        )
    upstream_epoch = upstream_epoch_at(caller, caller_branch, caller_epoch, caller_source)
    if upstream_epoch == 0:
        raise StateQueryError(f"the caller's epoch {caller_epoch} had read no upstream epoch yet")
    return state_at_epoch(repo, branch, upstream_epoch, timeout=timeout, **query)


__all__ = [
    "StateAnswer",
    "StateQueryError",
    "epoch_in_history",
    "epoch_snapshot",
    "state_as_of",
    "state_at",
    "state_at_epoch",
    "wait_for_epoch",
]
