"""Content-addressed, immutable objects: id, on-store encoding, verification on read.

An object's id is ``sha256(kind + b" " + len + b"\\0" + payload)`` over the uncompressed
payload; the stored bytes are ``b"EPO1 <kind> <len>\\n" + zstd(payload)``. Reading always
decompresses and re-hashes, so a flipped bit or a truncated file raises
`CorruptObjectError` instead of returning wrong bytes.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime, timedelta
from typing import Final

import zstandard

from snapshots_store.backends.base import Backend, KeyInfo
from snapshots_store.errors import CorruptObjectError, InvalidNameError, ObjectNotFoundError

KINDS: Final = frozenset({"chunk", "output", "manifest", "blob"})
MAGIC: Final = b"EPO1"
OBJECTS_PREFIX: Final = "objects/"
_ID_RE: Final = re.compile(r"[0-9a-f]{64}")
_MAX_HEADER: Final = 64
_FHD_SPARE_BITS: Final = 0x18  # zstd Frame_Header_Descriptor: unused bit 4, reserved bit 3
#: put_object rewrites an existing object older than this, so gc's grace period protects
#: an in-flight commit that re-uses an old (possibly unreachable) object.
REFRESH_AFTER: Final = timedelta(hours=1)


def is_object_id(value: object) -> bool:
    """True for a well-formed object id (64 lowercase hex digits)."""
    return isinstance(value, str) and _ID_RE.fullmatch(value) is not None


def check_object_id(value: str) -> str:
    if not is_object_id(value):
        raise InvalidNameError(value, "an object id is 64 lowercase hex digits")
    return value


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise InvalidNameError(kind, f"object kind must be one of {sorted(KINDS)}")
    return kind


def object_id(kind: str, payload: bytes) -> str:
    """The content address of a payload of the given kind."""
    check_kind(kind)
    digest = hashlib.sha256()
    digest.update(f"{kind} {len(payload)}\0".encode())
    digest.update(payload)
    return digest.hexdigest()


def object_key(oid: str) -> str:
    """Storage key of an object: ``objects/<id[:2]>/<id[2:]>``."""
    check_object_id(oid)
    return f"{OBJECTS_PREFIX}{oid[:2]}/{oid[2:]}"


def id_from_key(key: str) -> str | None:
    """Inverse of `object_key` for keys relative to a namespace; None for foreign keys."""
    if not key.startswith(OBJECTS_PREFIX):
        return None
    rest = key[len(OBJECTS_PREFIX) :]
    candidate = rest.replace("/", "", 1)
    if len(rest) != 65 or rest[2] != "/" or not is_object_id(candidate):
        return None
    return candidate


def encode(kind: str, payload: bytes, *, level: int = 3) -> bytes:
    """Stored form of an object."""
    check_kind(kind)
    header = b"%s %s %d\n" % (MAGIC, kind.encode(), len(payload))
    compressor = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return header + compressor.compress(payload)


def decode(oid: str, data: bytes) -> tuple[str, bytes]:
    """(kind, payload) of stored bytes, verified against `oid`; CorruptObjectError otherwise."""
    newline = data.find(b"\n", 0, _MAX_HEADER)
    if newline < 0:
        raise CorruptObjectError(oid, "no object header (truncated or not an object)")
    fields = data[:newline].split(b" ")
    if len(fields) != 3 or fields[0] != MAGIC:
        raise CorruptObjectError(oid, f"bad object header {data[:newline]!r}")
    kind = fields[1].decode("ascii", "replace")
    if kind not in KINDS or not fields[2].isdigit():
        raise CorruptObjectError(oid, f"bad object header {data[:newline]!r}")
    length = int(fields[2])
    body = data[newline + 1 :]
    if len(body) > 4 and body[4] & _FHD_SPARE_BITS:
        # Decoders ignore these bits, so a flip there would decode fine: refuse it anyway,
        # the stored bytes are not what was written.
        raise CorruptObjectError(oid, "zstd frame header has its unused/reserved bits set")
    try:
        declared = zstandard.frame_content_size(body)
        if declared != length:
            raise CorruptObjectError(oid, f"frame declares {declared} bytes, header {length}")
        stream = zstandard.ZstdDecompressor().decompressobj()
        payload = stream.decompress(body)
    except zstandard.ZstdError as exc:
        raise CorruptObjectError(oid, f"compressed payload does not decode ({exc})") from None
    if not stream.eof:
        raise CorruptObjectError(oid, "compressed payload is truncated")
    if stream.unused_data:
        raise CorruptObjectError(oid, f"{len(stream.unused_data)} stray bytes after the payload")
    if len(payload) != length:
        raise CorruptObjectError(oid, f"payload is {len(payload)} bytes, header says {length}")
    actual = object_id(kind, payload)
    if actual != oid:
        raise CorruptObjectError(oid, f"content hashes to {actual}")
    return kind, payload


class ObjectStore:
    """Objects of one namespace on a backend (plumbing under `Repository`)."""

    def __init__(self, backend: Backend, *, compression_level: int = 3) -> None:
        self.backend = backend
        self.compression_level = compression_level

    def put(self, kind: str, payload: bytes) -> str:
        """Store a payload; idempotent, returns its id."""
        oid = object_id(kind, payload)
        key = object_key(oid)
        info = self.backend.stat(key)
        if info is not None and datetime.now(UTC) - info.mtime < REFRESH_AFTER:
            return oid
        # Unconditional: a key's bytes are fixed by its content, so racing writers write the
        # same value; rewriting an old object refreshes the mtime gc's grace period looks at.
        self.backend.put(key, encode(kind, payload, level=self.compression_level))
        return oid

    def get(self, oid: str, *, context: str = "") -> tuple[str, bytes]:
        """(kind, verified payload) of an object."""
        blob = self.backend.get(object_key(oid))
        if blob is None:
            raise ObjectNotFoundError(oid, context)
        return decode(oid, blob.data)

    def has(self, oid: str) -> bool:
        return self.backend.stat(object_key(oid)) is not None

    def stat(self, oid: str) -> KeyInfo | None:
        return self.backend.stat(object_key(oid))

    def ids_with_prefix(self, prefix: str) -> list[str]:
        """Ids of stored objects starting with a hex prefix of at least 2 digits."""
        if len(prefix) < 2 or not re.fullmatch(r"[0-9a-f]+", prefix):
            raise InvalidNameError(prefix, "an id prefix is at least 2 lowercase hex digits")
        found = []
        for info in self.backend.list(f"{OBJECTS_PREFIX}{prefix[:2]}/{prefix[2:]}"):
            oid = id_from_key(info.key)
            if oid is not None and oid.startswith(prefix):
                found.append(oid)
        return sorted(found)
