"""Canonical bytes of a key: the input of the key-group hash (part of the snapshot format).

A ``str`` is its UTF-8 encoding. Every other supported type starts with the byte 0xFF, which
never occurs in UTF-8, followed by a one-byte type tag; so no two keys of different types
share an encoding. The encoding never changes once released (see docs/engine.md):

====================  ======================================================================
type                  canonical bytes
====================  ======================================================================
``str``               UTF-8
``None``              ``FF 00``
``bool``              ``FF 01`` + ``00`` / ``01``
``int`` (int64)       ``FF 02`` + 8 bytes big-endian two's complement
``int`` (larger)      ``FF 03`` + minimal big-endian two's complement
``bytes``             ``FF 04`` + the bytes
``tuple``             ``FF 05`` + 4-byte big-endian count, then per element a 4-byte
                      big-endian length and the element's canonical bytes
====================  ======================================================================
"""

from __future__ import annotations

from typing import TypeAlias

Key: TypeAlias = "str | int | bytes | bool | tuple[Key, ...] | None"

TAG: bytes = b"\xff"
TAG_NONE = TAG + b"\x00"
TAG_BOOL = TAG + b"\x01"
TAG_INT64 = TAG + b"\x02"
TAG_BIGINT = TAG + b"\x03"
TAG_BYTES = TAG + b"\x04"
TAG_TUPLE = TAG + b"\x05"

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


class UnsupportedKeyError(TypeError):
    """A key of a type that has no canonical encoding (float, dict, …)."""


def canonical_bytes(key: object) -> bytes:
    """The canonical bytes of a key (str, int, bytes, bool, None or tuples of these)."""
    if isinstance(key, str):
        return key.encode("utf-8")
    if key is None:
        return TAG_NONE
    if isinstance(key, bool):
        return TAG_BOOL + (b"\x01" if key else b"\x00")
    if isinstance(key, int):
        if _INT64_MIN <= key <= _INT64_MAX:
            return TAG_INT64 + key.to_bytes(8, "big", signed=True)
        length = (key.bit_length() + 8) // 8
        return TAG_BIGINT + key.to_bytes(length, "big", signed=True)
    if isinstance(key, bytes | bytearray | memoryview):
        return TAG_BYTES + bytes(key)
    if isinstance(key, tuple):
        parts = [TAG_TUPLE, len(key).to_bytes(4, "big")]
        for element in key:
            encoded = canonical_bytes(element)
            parts.append(len(encoded).to_bytes(4, "big"))
            parts.append(encoded)
        return b"".join(parts)
    raise UnsupportedKeyError(
        f"a key must be str, int, bytes, bool, None or a tuple of these, not "
        f"{type(key).__name__} ({key!r})"
    )
