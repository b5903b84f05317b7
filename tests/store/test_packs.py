"""Packs: many key-group chunks in one object with an index; reads fetch only the needed byte
ranges, verify what they return, and snapshots of loose chunks (format 1) still read."""

from __future__ import annotations

import hashlib
import io
import os
from datetime import timedelta
from pathlib import Path

import pytest
import zstandard

from snapshots_store import (
    CorruptObjectError,
    MalformedManifestError,
    Manifest,
    Repository,
    check_repository,
    collect_garbage,
)
from snapshots_store.backends import PrefixedBackend
from snapshots_store.backends.local import LocalBackend
from snapshots_store.codec import canonical_json
from snapshots_store.objects import encode_pack, object_id, object_key
from snapshots_store.packs import split_ref

from .helpers import manifest


class CountingBackend(LocalBackend):
    """The real local backend, counting the bytes each read returns."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.read_bytes = 0
        self.reads = 0

    def get(self, key: str):  # type: ignore[no-untyped-def]
        blob = super().get(key)
        self.reads += 1
        self.read_bytes += 0 if blob is None else len(blob.data)
        return blob

    def get_range(self, key: str, start: int, length: int) -> bytes | None:
        data = super().get_range(key, start, length)
        self.reads += 1
        self.read_bytes += 0 if data is None else len(data)
        return data

    def get_range_into(self, key: str, start: int, buffer: memoryview) -> int | None:
        got = super().get_range_into(key, start, buffer)
        self.reads += 1
        self.read_bytes += got or 0
        return got


def _payloads(count: int, size: int, seed: int = 0) -> dict[int, bytes]:
    return {kg: os.urandom(size) + bytes([seed]) for kg in range(count)}


def test_chunks_round_trip_as_size_bounded_packs(any_repo: Repository) -> None:
    payloads = _payloads(10, 1000)
    refs = any_repo.put_chunks(payloads, pack_bytes=3500)
    packs = {split_ref(r)[0] for r in refs.values()}
    assert len(packs) == 4  # 3 + 3 + 3 + 1 members of ~1 kB
    assert all(split_ref(refs[kg]) == (split_ref(refs[kg])[0], kg) for kg in refs)
    order = [7, 0, 9, 3, 3]
    assert any_repo.read_chunks([refs[kg] for kg in order]) == [payloads[kg] for kg in order]
    assert any_repo.read_chunk(refs[5]) == payloads[5]
    # a member's id is the id the same payload has as a loose chunk
    index = any_repo.chunks.index(split_ref(refs[5])[0])
    assert index.members[5].chunk_id == object_id("chunk", payloads[5])
    assert any_repo.chunk_size(refs[5]) == index.members[5].stored
    # writing the same chunks again yields the same packs (content addressed, idempotent)
    assert any_repo.put_chunks(payloads, pack_bytes=3500) == refs


def test_a_key_group_range_reads_only_its_members(tmp_path: Path) -> None:
    backend = CountingBackend(tmp_path / "store")
    repo = Repository(PrefixedBackend(backend, "app"))
    payloads = _payloads(64, 20_000)
    refs = repo.put_chunks(payloads)
    (pack,) = {split_ref(r)[0] for r in refs.values()}
    stored = repo.backend.stat(object_key(pack))
    assert stored is not None and stored.size > 64 * 20_000
    backend.read_bytes = backend.reads = 0
    wanted = list(range(16, 24))
    assert repo.read_chunks([refs[kg] for kg in wanted]) == [payloads[kg] for kg in wanted]
    # the index (one read) and one coalesced range of the 8 neighbouring members
    assert backend.reads == 2
    assert backend.read_bytes < 8 * 20_100 + 256 * 1024
    backend.read_bytes = backend.reads = 0
    repo.read_chunks([refs[kg] for kg in wanted])  # the index is cached now
    assert backend.reads == 1 and backend.read_bytes < 8 * 20_100


def test_loose_chunk_snapshots_still_read_and_mix_with_packs(any_repo: Repository) -> None:
    """A snapshot written before packs (format 1: loose chunk objects) reads as before, and a
    chain may continue with packed deltas after a loose base."""
    base = any_repo.put_object("chunk", b"base of kg 3")
    old = manifest(epoch=0, key_groups={3: [base]})
    assert old.format == 1 and b'"format":1' in old.to_bytes()
    old_id = any_repo.commit(old, "main", expected_head=None, reason="before packs")
    assert any_repo.read_chunks(any_repo.read_manifest(old_id).key_groups[3]) == [b"base of kg 3"]
    refs = any_repo.put_chunks({3: b"delta of kg 3", 4: b"base of kg 4"})
    new = manifest(epoch=1, parents=(old_id,), key_groups={3: [base, refs[3]], 4: [refs[4]]})
    assert new.format == 2
    new_id = any_repo.commit(new, "main", expected_head=old_id, reason="packed")
    stored = any_repo.read_manifest(new_id)
    assert Manifest.from_bytes(stored.to_bytes()) == stored
    assert any_repo.read_chunks(stored.key_groups[3]) == [b"base of kg 3", b"delta of kg 3"]
    diff = any_repo.diff(old_id, new_id)
    assert [c.key_group for c in diff.changed] == [3] and [c.key_group for c in diff.added] == [4]
    assert diff.changed[0].new_size == diff.changed[0].old_size + any_repo.chunk_size(refs[3])
    assert check_repository(any_repo).ok


def test_manifest_refuses_bad_chunk_refs() -> None:
    pack = "ab" * 32
    with pytest.raises(MalformedManifestError) as exc:
        manifest(key_groups={1: [f"{pack}:x"]})
    assert exc.value.field == "key_groups.1"
    with pytest.raises(MalformedManifestError) as exc:
        manifest(key_groups={1: [f"{pack}:01"]})
    assert exc.value.field == "key_groups.1"
    with pytest.raises(MalformedManifestError) as exc:
        manifest(key_groups={2: [f"{pack}:2"]}).with_changes(format=1)
    assert exc.value.field == "key_groups.2" and "format 2" in exc.value.detail
    doc = manifest(key_groups={2: [f"{pack}:2"]}).to_dict()
    doc["format"] = 3
    with pytest.raises(MalformedManifestError) as exc:
        Manifest.from_dict(doc)
    assert exc.value.field == "format"


def test_damage_to_one_member_is_caught_and_spares_the_others(repo: Repository) -> None:
    payloads = _payloads(4, 5000)
    refs = repo.put_chunks(payloads)
    pack = split_ref(refs[0])[0]
    head = repo.commit(manifest(key_groups={kg: [r] for kg, r in refs.items()}), "main",
                       expected_head=None, reason="packed")  # fmt: skip
    index = repo.chunks.index(pack)
    path = Path(repo.backend.url.removeprefix("file://")) / object_key(pack)
    data = bytearray(path.read_bytes())
    data[index.data_start + index.members[2].offset + 100] ^= 0x40
    path.write_bytes(bytes(data))
    fresh = Repository.open(repo.backend.url.rsplit("/", 1)[0], "app")
    with pytest.raises(CorruptObjectError) as exc:
        fresh.read_chunk(refs[2])
    assert pack in str(exc.value) and "key group 2" in str(exc.value)
    assert fresh.read_chunks([refs[0], refs[1], refs[3]]) == [payloads[k] for k in (0, 1, 3)]
    report = check_repository(fresh)
    assert [(p.kind, p.object_id) for p in report.problems] == [("corrupt-object", pack)]
    data[index.data_start - 5] ^= 0x01  # inside the compressed index
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptObjectError):
        Repository.open(repo.backend.url.rsplit("/", 1)[0], "app").read_chunk(refs[0])
    assert head


def test_fsck_reports_a_ref_to_a_member_the_pack_lacks(repo: Repository) -> None:
    refs = repo.put_chunks({0: b"zero", 1: b"one"})
    pack = split_ref(refs[0])[0]
    repo.commit(manifest(key_groups={0: [refs[0]], 5: [f"{pack}:5"]}), "main",
                expected_head=None, reason="bad ref")  # fmt: skip
    report = check_repository(repo)
    assert [(p.kind, p.key_group) for p in report.problems] == [("missing-object", 5)]
    assert "no member for key group 5" in report.problems[0].message


def test_gc_keeps_reachable_packs_and_removes_unreachable_ones(repo: Repository) -> None:
    kept = repo.put_chunks({0: b"kept 0", 1: b"kept 1"})
    lost = repo.put_chunks({0: b"lost 0"})
    repo.commit(manifest(key_groups={0: [kept[0]], 1: [kept[1]]}), "main",
                expected_head=None, reason="packed")  # fmt: skip
    import time

    time.sleep(1.1)
    report = collect_garbage(repo, retention=timedelta(0), grace=timedelta(0))
    assert [item.object_id for item in report.removed] == [split_ref(lost[0])[0]]
    assert repo.read_chunks([kept[0], kept[1]]) == [b"kept 0", b"kept 1"]
    assert check_repository(repo).ok


def _format1_pack(members: dict[int, bytes]) -> tuple[str, bytes]:
    """A pack as format 1 wrote it: index rows without frame hashes, no "format" key."""
    compressor = zstandard.ZstdCompressor(level=3, write_content_size=True)
    rows: list[list[int | str]] = []
    frames = []
    offset = 0
    for kg in sorted(members):
        frame = compressor.compress(members[kg])
        rows.append([kg, offset, len(frame), len(members[kg]), object_id("chunk", members[kg])])
        frames.append(frame)
        offset += len(frame)
    index = canonical_json({"members": rows})
    zindex = compressor.compress(index)
    header = b"EPO1 pack %d %d\n" % (len(index), len(zindex))
    return object_id("pack", index), b"".join([header, zindex, *frames])


def test_format1_packs_still_read_and_verify_by_chunk_id(repo: Repository) -> None:
    """Packs written before frame hashes (format 1) read, verify and pass fsck as before."""
    payloads = _payloads(3, 4000)
    pack, data = _format1_pack(payloads)
    repo.backend.put(object_key(pack), data)
    refs = {kg: f"{pack}:{kg}" for kg in payloads}
    repo.commit(manifest(key_groups={kg: [r] for kg, r in refs.items()}), "main",
                expected_head=None, reason="format 1 pack")  # fmt: skip
    index = repo.chunks.index(pack)
    assert index.format == 1 and index.members[1].frame_hash is None
    assert repo.read_chunks([refs[2], refs[0]]) == [payloads[2], payloads[0]]
    assert check_repository(repo).ok
    # a format 1 member is verified by its payload's chunk id
    damaged = bytearray(data)
    damaged[index.data_start + index.members[1].offset + 50] ^= 0x10
    repo.backend.put(object_key(pack), bytes(damaged))
    fresh = Repository.open(repo.backend.url.rsplit("/", 1)[0], "app")
    with pytest.raises(CorruptObjectError, match="key group 1"):
        fresh.read_chunk(refs[1])
    assert fresh.read_chunk(refs[0]) == payloads[0]


def test_format2_members_are_verified_by_their_frame_hash(repo: Repository) -> None:
    """A new pack names each member's frame hash: a read checks the stored bytes against it
    (one hash over the compressed bytes); fsck checks the payload's chunk id as well."""
    payloads = _payloads(3, 4000)
    refs = repo.put_chunks(payloads)
    pack = split_ref(refs[0])[0]
    index = repo.chunks.index(pack)
    assert index.format == 2 and b'"format":2' in index.payload
    stored = repo.backend.get(object_key(pack))
    assert stored is not None
    member = index.members[1]
    frame = stored.data[index.data_start + member.offset :][: member.stored]
    assert member.frame_hash == hashlib.sha256(frame).hexdigest()
    damaged = bytearray(stored.data)
    damaged[index.data_start + member.offset + 50] ^= 0x10
    repo.backend.put(object_key(pack), bytes(damaged))
    fresh = Repository.open(repo.backend.url.rsplit("/", 1)[0], "app")
    with pytest.raises(CorruptObjectError, match="key group 1's stored bytes do not hash"):
        fresh.read_chunk(refs[1])
    assert fresh.read_chunks([refs[0], refs[2]]) == [payloads[0], payloads[2]]


def test_a_pack_index_of_an_unknown_format_is_refused(repo: Repository) -> None:
    compressor = zstandard.ZstdCompressor(level=3, write_content_size=True)
    frame = compressor.compress(b"payload")
    row = [0, 0, len(frame), 7, object_id("chunk", b"payload"), hashlib.sha256(frame).hexdigest()]
    for doc, detail in [
        ({"codec": "zstd", "format": 3, "members": [row]}, "unknown format 3"),
        ({"format": 1, "members": [row[:5]]}, "unknown format 1"),  # format 1 has no key
        ({"codec": "zstd", "format": 2, "members": [row[:5]]}, "malformed"),  # 6 fields
        ({"members": [row]}, "malformed"),  # format 1 rows have 5
        ({"format": 2, "members": [row]}, "names no codec"),
        ({"codec": "brotli", "format": 2, "members": [row]}, "unknown codec 'brotli'"),
    ]:
        index = canonical_json(doc)
        zindex = compressor.compress(index)
        pack = object_id("pack", index)
        data = b"EPO1 pack %d %d\n" % (len(index), len(zindex)) + zindex + frame
        repo.backend.put(object_key(pack), data)
        with pytest.raises(CorruptObjectError, match=detail):
            Repository.open(repo.backend.url.rsplit("/", 1)[0], "app").read_chunk(f"{pack}:0")


def test_read_each_streams_format2_members_into_sinks(repo: Repository) -> None:
    """`read_each` with a sink writes a format 2 member's verified payload into it (each gets
    None); loose chunks and format 1 members still come as bytes; a damaged frame raises
    before anything is written."""
    payloads = _payloads(3, 50_000)
    refs = repo.put_chunks(payloads)
    loose = repo.put_object("chunk", b"a loose chunk")
    old_pack, data = _format1_pack({7: b"format 1 member"})
    repo.backend.put(object_key(old_pack), data)
    wanted = [refs[0], loose, refs[2], f"{old_pack}:7", refs[1]]
    sinks: dict[int, io.BytesIO] = {}
    got: dict[int, bytes | None] = {}

    def sink(position: int) -> io.BytesIO:
        sinks[position] = io.BytesIO()
        return sinks[position]

    repo.chunks.read_each(wanted, got.__setitem__, sink=sink)
    assert sorted(sinks) == [0, 2, 4]
    assert {p: s.getvalue() for p, s in sinks.items()} == {
        0: payloads[0],
        2: payloads[2],
        4: payloads[1],
    }
    assert got == {0: None, 1: b"a loose chunk", 2: None, 3: b"format 1 member", 4: None}
    pack = split_ref(refs[0])[0]
    index = repo.chunks.index(pack)
    stored = repo.backend.get(object_key(pack))
    assert stored is not None
    damaged = bytearray(stored.data)
    damaged[index.data_start + index.members[2].offset + 7] ^= 0x01
    repo.backend.put(object_key(pack), bytes(damaged))
    sinks.clear()
    with pytest.raises(CorruptObjectError, match="key group 2's stored bytes do not hash"):
        repo.chunks.read_each([refs[2]], got.__setitem__, sink=sink)
    assert all(not s.getvalue() for s in sinks.values())


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_format2_packs_of_either_codec_round_trip(repo: Repository, codec: str) -> None:
    """The index names the members' codec; both read back, by range and whole (fsck)."""
    payloads = {kg: (b"state row %d " % kg) * 2000 for kg in range(4)}
    pack, data = encode_pack(payloads, codec=codec)
    repo.backend.put(object_key(pack), data)
    index = repo.chunks.index(pack)
    assert index.codec == codec and index.format == 2
    assert sum(m.stored for m in index.members.values()) < sum(map(len, payloads.values())) / 4
    refs = [f"{pack}:{kg}" for kg in (3, 0, 2)]
    assert repo.read_chunks(refs) == [payloads[3], payloads[0], payloads[2]]
    sinks: dict[int, io.BytesIO] = {}
    repo.chunks.read_each(refs, lambda p, b: None, sink=lambda p: sinks.setdefault(p, io.BytesIO()))
    assert [sinks[p].getvalue() for p in range(3)] == [payloads[3], payloads[0], payloads[2]]
    repo.commit(manifest(key_groups={kg: [f"{pack}:{kg}"] for kg in payloads}), "main",
                expected_head=None, reason=codec)  # fmt: skip
    assert check_repository(repo).ok
    with pytest.raises(ValueError, match="pack codec"):
        encode_pack(payloads, codec="brotli")


def test_ranges_and_prefetch_name_exactly_the_reads(tmp_path: Path) -> None:
    """`ChunkReader.ranges` lists the stored byte ranges `read_each` reads (members of a
    pack coalesced, a loose chunk whole); `prefetch` hands them to the backend (the local one
    asks the kernel to read them ahead) and reports their bytes; a hint about a missing
    object or an empty range is no error."""
    backend = CountingBackend(tmp_path / "store")
    repo = Repository(PrefixedBackend(backend, "app"))
    refs = repo.put_chunks(_payloads(6, 3000))
    loose = repo.put_object("chunk", b"a loose chunk")
    pack = split_ref(refs[0])[0]
    index = repo.chunks.index(pack)
    wanted = [refs[4], refs[1], refs[2], loose]
    ranges = repo.chunks.ranges(wanted)
    members = index.members
    first = index.data_start + members[1].offset
    assert (pack, first, members[4].offset + members[4].stored - members[1].offset) in ranges
    loose_size = repo.objects.stat(loose)
    assert loose_size is not None
    assert (loose, 0, loose_size.size) in ranges and len(ranges) == 2
    before = backend.reads
    assert repo.chunks.prefetch(wanted) == sum(length for _, _, length in ranges)
    assert backend.reads == before  # a hint, not a read
    assert repo.read_chunks(wanted[:3]) == [repo.read_chunk(r) for r in wanted[:3]]
    backend.prefetch("app/objects/00/missing", 0, 10)
    backend.prefetch(object_key(pack), 0, 0)


def test_get_range_into_reads_into_the_callers_buffer(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "store")
    backend.put("a/b", b"0123456789")
    buffer = bytearray(8)
    assert backend.get_range_into("a/b", 3, memoryview(buffer)[:4]) == 4
    assert bytes(buffer[:4]) == b"3456"
    assert backend.get_range_into("a/b", 6, memoryview(buffer)) == 4  # fewer at the end
    assert bytes(buffer[:4]) == b"6789"
    assert backend.get_range_into("a/missing", 0, memoryview(buffer)) is None
    prefixed = PrefixedBackend(backend, "a")
    assert prefixed.get_range_into("b", 0, memoryview(buffer)[:2]) == 2
    assert bytes(buffer[:2]) == b"01"
    with pytest.raises(ValueError, match="starts at >= 0"):
        backend.get_range_into("a/b", -1, memoryview(buffer))
