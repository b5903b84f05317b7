"""Content-addressed, immutable objects: id, on-store encoding, verification on read.

An object's id is ``sha256(kind + b" " + len + b"\\0" + payload)`` over the uncompressed
payload; the stored bytes are ``b"EPO1 <kind> <len>\\n" + zstd(payload)``. Reading always
decompresses and re-hashes, so a flipped bit or a truncated file raises
`CorruptObjectError` instead of returning wrong bytes.

A *pack* holds the state chunks of many key groups in one object: ``b"EPO1 pack <index len>
<compressed index len>\\n" + zstd(index) + zstd(member 0) + zstd(member 1) …``. Its payload,
and so its id, is the index (canonical JSON naming each member's key group, byte range and
chunk id), which commits to every member's content: a reader verifies the index against the
pack id and each member it reads against its chunk id, without reading the other members.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import IO, Final, Protocol, cast

import pyarrow as pa
import zstandard

from snapshots_store.backends.base import Backend, KeyInfo
from snapshots_store.codec import canonical_json
from snapshots_store.errors import CorruptObjectError, InvalidNameError, ObjectNotFoundError

KINDS: Final = frozenset({"chunk", "output", "manifest", "blob", "pack"})
PACK: Final = "pack"
#: the pack index format `encode_pack` writes: 2 names each member's frame hash (a reader
#: verifies a member by hashing its compressed bytes, not its larger payload); format 1
#: (members without it, verified by their payload's chunk id) is still read
PACK_FORMAT: Final = 2
#: how a format 2 pack compresses its members (the index names it; format 1 is zstd):
#: ``zstd`` (level 3, about 3.5:1 on engine state) or ``lz4`` (LZ4 frames, about 1.7:1, but
#: about 3x faster to decompress and 2.5x faster to compress, see docs/store-format.md)
PACK_CODECS: Final = ("zstd", "lz4")
#: the codec `put_chunks` writes packs with
PACK_CODEC: Final = "lz4"
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


def _decompress(oid: str, body: bytes | memoryview, length: int) -> bytes:
    """The payload of one zstd frame that must declare and hold exactly `length` bytes."""
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
    return payload


def decode(oid: str, data: bytes) -> tuple[str, bytes]:
    """(kind, payload) of stored bytes, verified against `oid`; CorruptObjectError otherwise.

    A pack's payload is its index; every member is verified too."""
    newline = data.find(b"\n", 0, _MAX_HEADER)
    if newline < 0:
        raise CorruptObjectError(oid, "no object header (truncated or not an object)")
    if data.startswith(b"%s %s " % (MAGIC, PACK.encode())):
        index = pack_index(oid, data)
        end = index.data_start
        for member in index.members.values():
            end = index.data_start + member.offset + member.stored
            member_payload(index, member, data[index.data_start + member.offset : end], full=True)
        if len(data) != end:
            raise CorruptObjectError(oid, f"{len(data) - end} stray bytes after the last member")
        return PACK, index.payload
    fields = data[:newline].split(b" ")
    if len(fields) != 3 or fields[0] != MAGIC:
        raise CorruptObjectError(oid, f"bad object header {data[:newline]!r}")
    kind = fields[1].decode("ascii", "replace")
    if kind not in KINDS or kind == PACK or not fields[2].isdigit():
        raise CorruptObjectError(oid, f"bad object header {data[:newline]!r}")
    payload = _decompress(oid, data[newline + 1 :], int(fields[2]))
    actual = object_id(kind, payload)
    if actual != oid:
        raise CorruptObjectError(oid, f"content hashes to {actual}")
    return kind, payload


# -- packs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PackMember:
    """Where one key group's chunk lies in a pack: `offset` from the first member byte,
    `stored` compressed bytes, `size` payload bytes, `chunk_id` the payload's chunk id,
    `frame_hash` the sha256 of its stored bytes (hex; None in a format 1 pack)."""

    key_group: int
    offset: int
    stored: int
    size: int
    chunk_id: str
    frame_hash: str | None = None


@dataclass(frozen=True)
class PackIndex:
    """A pack's verified index: members by key group; `data_start` is the stored offset of
    the first member byte."""

    pack_id: str
    data_start: int
    members: dict[int, PackMember]
    payload: bytes
    format: int = PACK_FORMAT
    codec: str = "zstd"

    @property
    def stored_size(self) -> int:
        return self.data_start + sum(m.stored for m in self.members.values())


def encode_pack(
    members: Mapping[int, bytes], *, level: int = 3, codec: str = PACK_CODEC
) -> tuple[str, bytes]:
    """(pack id, stored bytes) of key-group chunk payloads (one member per key group), each
    member compressed with `codec` (one of `PACK_CODECS`; `level` is zstd's)."""
    if not members:
        raise ValueError("a pack holds at least one chunk")
    if codec not in PACK_CODECS:
        raise ValueError(f"pack codec {codec!r}: one of {list(PACK_CODECS)}")
    compressor = zstandard.ZstdCompressor(level=level, write_content_size=True)
    lz4 = pa.Codec("lz4") if codec == "lz4" else None
    frames: list[bytes] = []
    rows: list[list[int | str]] = []
    offset = 0
    for key_group in sorted(members):
        payload = bytes(members[key_group])
        frame = compressor.compress(payload) if lz4 is None else lz4.compress(payload, asbytes=True)
        chunk = object_id("chunk", payload)
        frame_hash = hashlib.sha256(frame).hexdigest()
        rows.append([key_group, offset, len(frame), len(payload), chunk, frame_hash])
        frames.append(frame)
        offset += len(frame)
    index = canonical_json({"codec": codec, "format": PACK_FORMAT, "members": rows})
    zindex = compressor.compress(index)
    header = b"%s %s %d %d\n" % (MAGIC, PACK.encode(), len(index), len(zindex))
    return object_id(PACK, index), b"".join([header, zindex, *frames])


def pack_head_length(oid: str, head: bytes) -> int:
    """Stored bytes from the start of a pack to its first member (header + index), read from
    its first bytes (at least the header line)."""
    newline = head.find(b"\n", 0, _MAX_HEADER)
    fields = head[:newline].split(b" ") if newline >= 0 else []
    if (
        len(fields) != 4
        or fields[:2] != [MAGIC, PACK.encode()]
        or not all(f.isdigit() for f in fields[2:])
    ):
        raise CorruptObjectError(oid, f"bad pack header {head[: max(newline, 0) or 32]!r}")
    return newline + 1 + int(fields[3])


def pack_index(oid: str, head: bytes) -> PackIndex:
    """The verified index of a pack from its stored bytes up to `pack_head_length` (or more)."""
    data_start = pack_head_length(oid, head)
    if len(head) < data_start:
        raise CorruptObjectError(oid, "the pack is truncated inside its index")
    newline = head.index(b"\n")
    length = int(head[:newline].split(b" ")[2])
    index = _decompress(oid, head[newline + 1 : data_start], length)
    if object_id(PACK, index) != oid:
        raise CorruptObjectError(oid, f"pack index hashes to {object_id(PACK, index)}")
    try:
        doc = json.loads(index)
        version = doc.get("format", 1) if set(doc) <= {"codec", "format", "members"} else None
        if version not in (1, 2) or (version == 1 and set(doc) != {"members"}):
            raise CorruptObjectError(oid, f"pack index has unknown format {version!r} (1 or 2)")
        if version == 2 and "codec" not in doc:
            raise CorruptObjectError(oid, "a format 2 pack index names no codec")
        codec = doc.get("codec", "zstd")
        if codec not in PACK_CODECS:
            raise CorruptObjectError(oid, f"pack index names unknown codec {codec!r}")
        width = 5 if version == 1 else 6
        if any(len(row) != width for row in doc["members"]):
            raise ValueError(f"a format {version} member row has {width} fields")
        listed = [
            PackMember(int(g), int(o), int(st), int(sz), str(c), *(str(h) for h in rest))
            for g, o, st, sz, c, *rest in doc["members"]
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptObjectError(oid, f"pack index is malformed ({exc})") from None
    members: dict[int, PackMember] = {}
    end = 0
    for member in listed:  # written by encode_pack: sorted by key group, back to back
        if member.key_group in members or member.offset != end or member.stored <= 0:
            raise CorruptObjectError(oid, f"pack index lists member {member} out of order")
        if not is_object_id(member.chunk_id):
            raise CorruptObjectError(oid, f"pack index names chunk {member.chunk_id!r}")
        if member.frame_hash is not None and not is_object_id(member.frame_hash):
            raise CorruptObjectError(oid, f"pack index names frame hash {member.frame_hash!r}")
        members[member.key_group] = member
        end += member.stored
    if not members:
        raise CorruptObjectError(oid, "pack index lists no member")
    return PackIndex(oid, data_start, members, index, version, codec)


class Sink(Protocol):
    """Where `member_payload_into` writes a payload: anything with a binary ``write``."""

    def write(self, data: bytes | memoryview, /) -> object: ...


#: output of one step of `member_payload_into` (a reused buffer's size, not the payload's)
STREAM_BYTES: Final = 1024**2


def _check_frame(index: PackIndex, member: PackMember, frame: bytes | memoryview) -> None:
    what = f"the member for key group {member.key_group}"
    if len(frame) != member.stored:
        raise CorruptObjectError(
            index.pack_id, f"{what} is {len(frame)} bytes, the index says {member.stored}"
        )
    if member.frame_hash is not None and hashlib.sha256(frame).hexdigest() != member.frame_hash:
        raise CorruptObjectError(
            index.pack_id, f"{what}'s stored bytes do not hash to {member.frame_hash}"
        )


def _lz4_decompress(index: PackIndex, member: PackMember, frame: bytes | memoryview) -> pa.Buffer:
    """An LZ4 member's payload (its frame already verified by its frame hash)."""
    what = f"the member for key group {member.key_group}"
    try:
        payload = pa.Codec("lz4").decompress(frame, decompressed_size=member.size)
    except (OSError, pa.ArrowException) as exc:
        raise CorruptObjectError(index.pack_id, f"{what} does not decode ({exc})") from None
    if payload.size != member.size:
        raise CorruptObjectError(
            index.pack_id, f"{what} decodes to {payload.size} bytes, the index says {member.size}"
        )
    return payload


def member_payload_into(
    index: PackIndex, member: PackMember, frame: bytes | memoryview, sink: Sink
) -> None:
    """Write a format 2 member's payload into `sink` (e.g. a binary file), decompressed
    in `STREAM_BYTES` steps: no payload-sized buffer is allocated. The frame is verified
    against its frame hash first, so what is written decodes from exactly the stored bytes;
    a frame that still does not decode to `member.size` bytes raises `CorruptObjectError`
    (the sink then holds a partial payload: the caller discards it)."""
    if member.frame_hash is None:
        raise ValueError("a format 1 member is verified by its payload: use member_payload")
    _check_frame(index, member, frame)
    if index.codec == "lz4":
        sink.write(memoryview(_lz4_decompress(index, member, frame)))
        return
    try:
        source, out = io.BytesIO(frame), cast("IO[bytes]", sink)
        _, written = zstandard.ZstdDecompressor().copy_stream(
            source, out, read_size=len(frame), write_size=STREAM_BYTES
        )
    except zstandard.ZstdError as exc:
        raise CorruptObjectError(
            index.pack_id, f"the member for key group {member.key_group} does not decode ({exc})"
        ) from None
    if written != member.size:
        raise CorruptObjectError(
            index.pack_id,
            f"the member for key group {member.key_group} decodes to {written} bytes, "
            f"the index says {member.size}",
        )


def member_payload(
    index: PackIndex, member: PackMember, frame: bytes | memoryview, *, full: bool = False
) -> bytes:
    """A member's verified payload from its stored bytes. A format 2 member is verified by
    its frame hash (the index, verified against the pack id, names it), so the payload comes
    from exactly the bytes that were written; `full` checks its chunk id too (fsck). A
    format 1 member is verified by its payload's chunk id."""
    what = f"the member for key group {member.key_group}"
    _check_frame(index, member, frame)
    if index.codec == "lz4":
        payload: bytes = _lz4_decompress(index, member, frame).to_pybytes()
        if full and object_id("chunk", payload) != member.chunk_id:
            raise CorruptObjectError(index.pack_id, f"{what} does not hash to {member.chunk_id}")
        return payload
    try:
        payload = _decompress(index.pack_id, frame, member.size)
    except CorruptObjectError as exc:
        raise CorruptObjectError(index.pack_id, f"{what}: {exc.detail}") from None
    if (full or member.frame_hash is None) and object_id("chunk", payload) != member.chunk_id:
        raise CorruptObjectError(index.pack_id, f"{what} does not hash to {member.chunk_id}")
    return payload


class ObjectStore:
    """Objects of one namespace on a backend (plumbing under `Repository`)."""

    def __init__(self, backend: Backend, *, compression_level: int = 3) -> None:
        self.backend = backend
        self.compression_level = compression_level

    def put(self, kind: str, payload: bytes) -> str:
        """Store a payload; idempotent, returns its id."""
        if kind == PACK:
            raise InvalidNameError(kind, "packs are written with put_pack (their members)")
        oid = object_id(kind, payload)
        self._write(oid, lambda: encode(kind, payload, level=self.compression_level))
        return oid

    def put_pack(self, members: Mapping[int, bytes]) -> str:
        """Store key-group chunk payloads as one pack object (one write); returns its id."""
        oid, data = encode_pack(members, level=self.compression_level)
        self._write(oid, lambda: data)
        return oid

    def _write(self, oid: str, encoded: Callable[[], bytes]) -> None:
        key = object_key(oid)
        info = self.backend.stat(key)
        if info is not None and datetime.now(UTC) - info.mtime < REFRESH_AFTER:
            return
        # Unconditional: a key's bytes are fixed by its content, so racing writers write the
        # same value; rewriting an old object refreshes the mtime gc's grace period looks at.
        self.backend.put(key, encoded())

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
