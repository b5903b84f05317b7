"""The keyed state a per-key function sees: value, list and map states with optional TTL.

A key's states live in one pickled dict ``{name: (kind, value, expires_at_ms | None)}``
stored in the key group's chunk. TTL is measured in epoch-scoped processing time
(`EpochContext.processing_time_ms`), so a replay expires exactly what the original run did.
Expired entries read as absent and are dropped when the key is next written.
"""

from __future__ import annotations

import hashlib
import pickle
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from runners.engine.state.timers import Timers

Entry = tuple[str, Any, int | None]


@dataclass
class EpochContext:
    """Deterministic facts of one (branch, epoch, key group) offered to user code.

    `watermark_ms`: the event-time watermark the epoch applies (None without event time or
    before the first watermark); `timers`: the current key's timers (state/timers.py);
    `timer_domain`: inside ``on_timer``, ``"event"`` or ``"processing"`` (None in
    ``process``)."""

    branch: str
    epoch: int
    key_group: int
    parallelism: int
    task: int
    processing_time_ms: int
    random: random.Random = field(repr=False)
    watermark_ms: int | None = None
    timers: Timers = field(default_factory=Timers, repr=False)
    timer_domain: str | None = None


def epoch_seed(branch: str, epoch: int, key_group: int) -> int:
    """The RNG seed of a (branch, epoch, key group): stable across processes and runs."""
    digest = hashlib.sha256(f"{branch}\0{epoch}\0{key_group}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


class _State:
    def __init__(self, owner: KeyedState, name: str, kind: str, ttl_ms: int | None) -> None:
        self._owner, self._name, self._kind, self._ttl = owner, name, kind, ttl_ms

    def _get(self) -> Any:
        return self._owner._read(self._name, self._kind)

    def _set(self, value: Any) -> None:
        self._owner._write(self._name, self._kind, value, self._ttl)

    def clear(self) -> None:
        """Remove this state of the current key."""
        self._owner._entries.pop(self._name, None)
        self._owner.changed = True


class ValueState(_State):
    """One value per key."""

    def get(self, default: Any = None) -> Any:
        value = self._get()
        return default if value is None else value

    def set(self, value: Any) -> None:
        self._set(value)


class ListState(_State):
    """A list per key."""

    def get(self) -> list[Any]:
        return list(self._get() or [])

    def append(self, value: Any) -> None:
        items = self.get()
        items.append(value)
        self._set(items)

    def extend(self, values: Any) -> None:
        items = self.get()
        items.extend(values)
        self._set(items)

    def set(self, values: list[Any]) -> None:
        self._set(list(values))


class MapState(_State):
    """A dict per key."""

    def _map(self) -> dict[Any, Any]:
        return dict(self._get() or {})

    def get(self, key: Any, default: Any = None) -> Any:
        return self._map().get(key, default)

    def put(self, key: Any, value: Any) -> None:
        items = self._map()
        items[key] = value
        self._set(items)

    def remove(self, key: Any) -> None:
        items = self._map()
        items.pop(key, None)
        self._set(items)

    def items(self) -> Iterator[tuple[Any, Any]]:
        return iter(self._map().items())

    def __contains__(self, key: object) -> bool:
        return key in self._map()


class KeyedState:
    """All states of one key, as handed to the per-key function."""

    def __init__(self, payload: bytes | None, now_ms: int) -> None:
        self._entries: dict[str, Entry] = pickle.loads(payload) if payload else {}
        self._now = now_ms
        self.changed = False

    def value(self, name: str, *, ttl_ms: int | None = None) -> ValueState:
        return ValueState(self, name, "value", ttl_ms)

    def list(self, name: str, *, ttl_ms: int | None = None) -> ListState:
        return ListState(self, name, "list", ttl_ms)

    def map(self, name: str, *, ttl_ms: int | None = None) -> MapState:
        return MapState(self, name, "map", ttl_ms)

    def _read(self, name: str, kind: str) -> Any:
        entry = self._entries.get(name)
        if entry is None:
            return None
        if entry[0] != kind:
            raise TypeError(f"state {name!r} is a {entry[0]} state, not a {kind} state")
        if entry[2] is not None and entry[2] <= self._now:
            return None
        return entry[1]

    def _write(self, name: str, kind: str, value: Any, ttl_ms: int | None) -> None:
        expires = None if ttl_ms is None else self._now + ttl_ms
        self._entries[name] = (kind, value, expires)
        self.changed = True

    def to_payload(self) -> tuple[bytes | None, int | None]:
        """(pickled live entries or None when empty, earliest expiry or None)."""
        live = {n: e for n, e in self._entries.items() if e[2] is None or e[2] > self._now}
        if not live:
            return None, None
        expiries = [e[2] for e in live.values() if e[2] is not None]
        return pickle.dumps(live, protocol=5), (min(expiries) if expiries else None)
