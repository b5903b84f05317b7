"""Objects: content addressing, idempotent writes, verification on every read."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapshots_store import CorruptObjectError, InvalidNameError, ObjectNotFoundError, Repository
from snapshots_store.objects import decode, encode, object_id, object_key


def test_object_id_is_sha256_of_kind_length_and_payload() -> None:
    payload = b"hello state"
    expected = hashlib.sha256(b"chunk 11\0" + payload).hexdigest()
    assert object_id("chunk", payload) == expected


def test_stored_form_is_header_plus_zstd(repo: Repository, local_root: Path) -> None:
    oid = repo.put_object("output", b"rows" * 100)
    stored = (local_root / "app" / object_key(oid)).read_bytes()
    header, body = stored.split(b"\n", 1)
    assert header == b"EPO1 output 400"
    assert zstandard.ZstdDecompressor().decompress(body) == b"rows" * 100


def test_put_is_idempotent_and_get_round_trips(repo: Repository) -> None:
    first = repo.put_object("chunk", b"abc")
    second = repo.put_object("chunk", b"abc")
    assert first == second
    assert repo.get_object(first) == b"abc"
    assert repo.has_object(first)
    assert repo.get_object(repo.put_object("blob", b"")) == b""


def test_same_payload_of_different_kinds_are_different_objects(repo: Repository) -> None:
    assert repo.put_object("chunk", b"x") != repo.put_object("output", b"x")


def test_missing_object_raises_not_found_naming_it(repo: Repository) -> None:
    oid = "ab" * 32
    with pytest.raises(ObjectNotFoundError, match=oid):
        repo.get_object(oid)
    assert not repo.has_object(oid)


@pytest.mark.parametrize("bad", ["", "abc", "AB" * 32, "../" + "a" * 61, "a" * 63 + "\0"])
def test_malformed_object_id_is_rejected(repo: Repository, bad: str) -> None:
    with pytest.raises(InvalidNameError):
        repo.get_object(bad)


def test_unknown_kind_is_rejected(repo: Repository) -> None:
    with pytest.raises(InvalidNameError, match="kind"):
        repo.put_object("tree", b"x")


def _corruptions(stored: bytes) -> dict[str, bytes]:
    header_end = stored.index(b"\n") + 1
    flipped = bytearray(stored)
    flipped[-1] ^= 0x01
    flipped_header = bytearray(stored)
    flipped_header[6] ^= 0x01
    return {
        "flipped payload byte": bytes(flipped),
        "flipped header byte": bytes(flipped_header),
        "truncated": stored[: len(stored) - 5],
        "truncated to header": stored[:header_end],
        "empty": b"",
        "trailing garbage": stored + b"junk",
        "length lie": stored.replace(b" 4000\n", b" 4001\n", 1),
        "other object": encode("chunk", b"different"),
    }


@pytest.mark.parametrize("fault", list(_corruptions(encode("chunk", b"s" * 4000))))
def test_reading_a_corrupt_object_raises_and_never_returns_bytes(
    repo: Repository, local_root: Path, fault: str
) -> None:
    oid = repo.put_object("chunk", bytes(range(250)) * 16)
    path = local_root / "app" / object_key(oid)
    path.write_bytes(_corruptions(path.read_bytes())[fault])
    with pytest.raises(CorruptObjectError) as excinfo:
        repo.get_object(oid)
    assert oid in str(excinfo.value)
    assert "fsck" in str(excinfo.value)


def test_decode_rejects_a_header_of_another_kind() -> None:
    data = encode("chunk", b"payload")
    oid = object_id("chunk", b"payload")
    assert decode(oid, data) == ("chunk", b"payload")
    with pytest.raises(CorruptObjectError):
        decode(oid, data.replace(b"chunk", b"blob!", 1))


def test_rewriting_an_old_object_refreshes_its_mtime(repo: Repository, local_root: Path) -> None:
    import os

    oid = repo.put_object("chunk", b"reused")
    path = local_root / "app" / object_key(oid)
    os.utime(path, (1_000_000, 1_000_000))
    repo.put_object("chunk", b"reused")
    assert path.stat().st_mtime > 1_000_000
    assert repo.get_object(oid) == b"reused"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["chunk", "output", "manifest", "blob"]),
    payload=st.binary(max_size=5000),
    level=st.integers(1, 19),
)
def test_any_payload_decodes_to_itself_whatever_the_compression_level(
    kind: str, payload: bytes, level: int
) -> None:
    oid = object_id(kind, payload)
    assert decode(oid, encode(kind, payload, level=level)) == (kind, payload)
    assert decode(oid, encode(kind, payload, level=1)) == (kind, payload)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=st.binary(min_size=1, max_size=2000), data=st.data())
def test_a_flipped_bit_never_yields_wrong_bytes(payload: bytes, data: st.DataObject) -> None:
    oid = object_id("chunk", payload)
    stored = bytearray(encode("chunk", payload))
    position = data.draw(st.integers(0, len(stored) - 1))
    stored[position] ^= 1 << data.draw(st.integers(0, 7))
    try:
        result = decode(oid, bytes(stored))
    except CorruptObjectError:
        return
    # A few flips decode to the same payload (e.g. a 1-byte raw block read as a 1-byte
    # run-length block): the bytes returned are still exactly the original ones.
    assert result == ("chunk", payload)


def test_flips_in_ignored_zstd_header_bits_are_still_reported() -> None:
    payload = b"some state"
    stored = bytearray(encode("chunk", payload))
    frame_header_descriptor = stored.index(b"\n") + 1 + 4
    for bit in (3, 4):
        flipped = bytearray(stored)
        flipped[frame_header_descriptor] ^= 1 << bit
        with pytest.raises(CorruptObjectError, match="unused/reserved bits"):
            decode(object_id("chunk", payload), bytes(flipped))
