"""The `Backend` protocol: where the store's bytes live.

A backend maps string keys (``objects/ab/cd…``, ``refs/heads/main`` …) to byte strings. It
knows nothing about objects or refs; it only promises atomic whole-value writes and the
conditional writes that refs and control documents need for compare-and-swap.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

from snapshots_store.errors import InvalidNameError


@dataclass(frozen=True)
class Blob:
    """A value read from a backend with the version token a conditional write must match."""

    data: bytes
    version: str


@dataclass(frozen=True)
class KeyInfo:
    """Size (stored bytes) and last-modified time (UTC) of one key."""

    key: str
    size: int
    mtime: datetime


@runtime_checkable
class Backend(Protocol):
    """Key-value storage with atomic writes and compare-and-swap.

    Guarantees every implementation gives:

    * a reader sees either the whole old value or the whole new value of a key, never a mix;
    * `put_if_absent` and `put_if_match` are atomic across processes (and machines, for
      shared backends): of several racing conditional writers at most one succeeds;
    * a write that returned is durable.

    Version tokens are opaque; two writes of identical bytes may yield the same token, so
    callers that need ABA protection put a counter in the value (refs and control do).
    """

    url: str

    def get(self, key: str) -> Blob | None:
        """The value and version of `key`, or None when it does not exist."""
        ...

    def get_range(self, key: str, start: int, length: int) -> bytes | None:
        """`length` bytes of `key` from byte `start` (fewer at its end); None when absent."""
        ...

    def get_range_into(self, key: str, start: int, buffer: memoryview) -> int | None:
        """Read `key` from byte `start` into `buffer` (up to its length; fewer at the key's
        end): the number of bytes read, or None when the key is absent."""
        ...

    def prefetch(self, key: str, start: int, length: int) -> None:
        """A hint that `get_range(key, start, length)` follows soon: a backend that can
        start reading it in the background does (the local one asks the kernel to read it
        into the page cache); others do nothing. Never an error, not even for a missing key."""
        ...

    def put(self, key: str, data: bytes) -> str:
        """Write `key` unconditionally; returns the new version."""
        ...

    def put_if_absent(self, key: str, data: bytes) -> str | None:
        """Create `key`; returns the new version, or None when the key already exists."""
        ...

    def put_if_match(self, key: str, data: bytes, version: str) -> str | None:
        """Replace `key` if its version is still `version`; None when it changed or vanished."""
        ...

    def delete(self, key: str) -> None:
        """Remove `key` (a complete or a partial one); no error when it is absent."""
        ...

    def list(self, prefix: str) -> Iterator[KeyInfo]:
        """Every complete key starting with `prefix`, in no particular order."""
        ...

    def list_partial(self, prefix: str) -> Iterator[KeyInfo]:
        """Leftovers of interrupted writes under `prefix` (temp files); `delete` removes them."""
        ...

    def stat(self, key: str) -> KeyInfo | None:
        """Size and modification time of `key`, or None when it does not exist."""
        ...


def check_key(key: str) -> str:
    """Reject keys that could leave the backend's root; every backend calls this first."""
    if not key or key.startswith("/") or "\\" in key or "\0" in key:
        raise InvalidNameError(key, "storage keys are relative, '/'-separated, without NUL")
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise InvalidNameError(key, "storage keys have no empty, '.' or '..' segments")
    return key


class PrefixedBackend:
    """A view of another backend under a key prefix (one namespace of a store root)."""

    def __init__(self, inner: Backend, prefix: str) -> None:
        check_key(prefix)
        self.inner = inner
        self.prefix = prefix.rstrip("/") + "/"
        parts = urlsplit(inner.url)
        path = f"{parts.path.rstrip('/')}/{self.prefix.rstrip('/')}"
        self.url = urlunsplit(parts._replace(path=path))

    def _k(self, key: str) -> str:
        return self.prefix + check_key(key)

    def _strip(self, info: KeyInfo) -> KeyInfo:
        return KeyInfo(info.key[len(self.prefix) :], info.size, info.mtime)

    def get(self, key: str) -> Blob | None:
        return self.inner.get(self._k(key))

    def get_range(self, key: str, start: int, length: int) -> bytes | None:
        return self.inner.get_range(self._k(key), start, length)

    def get_range_into(self, key: str, start: int, buffer: memoryview) -> int | None:
        return self.inner.get_range_into(self._k(key), start, buffer)

    def prefetch(self, key: str, start: int, length: int) -> None:
        self.inner.prefetch(self._k(key), start, length)

    def put(self, key: str, data: bytes) -> str:
        return self.inner.put(self._k(key), data)

    def put_if_absent(self, key: str, data: bytes) -> str | None:
        return self.inner.put_if_absent(self._k(key), data)

    def put_if_match(self, key: str, data: bytes, version: str) -> str | None:
        return self.inner.put_if_match(self._k(key), data, version)

    def delete(self, key: str) -> None:
        self.inner.delete(self._k(key))

    def list(self, prefix: str) -> Iterator[KeyInfo]:
        for info in self.inner.list(self.prefix + prefix):
            yield self._strip(info)

    def list_partial(self, prefix: str) -> Iterator[KeyInfo]:
        for info in self.inner.list_partial(self.prefix + prefix):
            yield self._strip(info)

    def stat(self, key: str) -> KeyInfo | None:
        return self.inner.stat(self._k(key))
