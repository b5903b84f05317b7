"""Manifest: canonical JSON, normalisation, strict validation naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapshots_store import MalformedManifestError, Manifest, Repository
from snapshots_store.codec import canonical_json
from snapshots_store.manifest import COMMIT_KINDS

from .helpers import manifest

CHUNK = "c" * 64
PARENT = "a" * 64


def _valid_doc() -> dict[str, Any]:
    m = manifest(parents=(PARENT,), epoch=3, key_groups={5: [CHUNK]}, offsets={"kafka": {"0": 10}})
    return m.to_dict()


def test_round_trip_through_bytes_is_identity() -> None:
    m = manifest(parents=(PARENT,), epoch=3, key_groups={5: [CHUNK], 1: [CHUNK, CHUNK]})
    again = Manifest.from_bytes(m.to_bytes())
    assert again == m
    assert again.to_bytes() == m.to_bytes()


def test_json_form_is_canonical_with_string_key_groups() -> None:
    m = manifest(key_groups={10: [CHUNK], 2: [CHUNK]}, offsets={"s": {0: 1}})  # type: ignore[dict-item]
    doc = json.loads(m.to_bytes())
    assert list(doc["key_groups"]) == ["10", "2"]
    assert doc["offsets"] == {"s": {"0": 1}}
    assert m.to_bytes() == canonical_json(doc)
    assert m.key_groups == {2: (CHUNK,), 10: (CHUNK,)}


def test_equal_manifests_get_equal_ids(repo: Repository) -> None:
    a = manifest(key_groups={1: [CHUNK]}, offsets={"s": {"0": 1}})
    b = manifest(key_groups={1: (CHUNK,)}, offsets={"s": {"0": 1}})
    assert repo.write_manifest(a) == repo.write_manifest(b)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("format", 3),
        ("format", True),
        ("parents", [PARENT, PARENT]),
        ("parents", ["nothex"]),
        ("parents", "a" * 64),
        ("branch", "../x"),
        ("branch", ""),
        ("epoch", -1),
        ("epoch", 1.0),
        ("epoch", True),
        ("offsets", {"s": {"0": -1}}),
        ("offsets", {"": {"0": 1}}),
        ("offsets", []),
        ("max_parallelism", 0),
        ("max_parallelism", 32769),
        ("parallelism", 17),
        ("key_groups", {"16": [CHUNK]}),
        ("key_groups", {"01": [CHUNK]}),
        ("key_groups", {"x": [CHUNK]}),
        ("key_groups", {"1": []}),
        ("key_groups", {"1": ["zz"]}),
        ("outputs", [1]),
        ("code_version", 3),
        ("kind", "merge"),
        ("operation_id", 7),
        ("created_at", "yesterday"),
        ("created_at", "2026-01-01T00:00:00+02:00"),
        ("created_at", "2026-01-01T00:00:00"),
        ("processing_time_ms", -5),
        ("stats", {"n": "many"}),
        ("provenance", {"source": 1}),
        ("extra", []),
    ],
)
def test_malformed_field_is_named(field: str, value: object) -> None:
    doc = _valid_doc()
    doc[field] = value
    with pytest.raises(MalformedManifestError) as excinfo:
        Manifest.from_bytes(json.dumps(doc).encode(), "f" * 64)
    assert excinfo.value.field.split(".")[0] == field
    assert f"`{excinfo.value.field}`" in str(excinfo.value)
    assert "f" * 64 in str(excinfo.value)


@pytest.mark.parametrize(
    "data",
    [b"", b"not json", b"[]", b"\xff\xfe", b'{"format": NaN}', json.dumps({"a": 1}).encode()],
)
def test_malformed_bytes_raise(data: bytes) -> None:
    with pytest.raises(MalformedManifestError):
        Manifest.from_bytes(data)


def test_missing_and_unknown_fields_are_named() -> None:
    doc = _valid_doc()
    del doc["epoch"]
    with pytest.raises(MalformedManifestError, match="`epoch` is missing"):
        Manifest.from_bytes(json.dumps(doc).encode())
    doc = _valid_doc()
    doc["colour"] = "blue"
    with pytest.raises(MalformedManifestError, match="`colour` is not a manifest field"):
        Manifest.from_bytes(json.dumps(doc).encode())


def test_constructor_validates_too() -> None:
    with pytest.raises(MalformedManifestError, match="parallelism"):
        manifest().with_changes(parallelism=0)
    with pytest.raises(MalformedManifestError, match="stats"):
        manifest().with_changes(stats={"x": float("nan")})


def test_read_manifest_of_a_chunk_is_a_clear_error(repo: Repository) -> None:
    oid = repo.put_object("chunk", manifest().to_bytes())
    with pytest.raises(MalformedManifestError, match="not a manifest"):
        repo.read_manifest(oid)


def test_stored_malformed_manifest_raises_on_read(repo: Repository) -> None:
    oid = repo.put_object("manifest", b'{"format": 1}')
    with pytest.raises(MalformedManifestError) as excinfo:
        repo.read_manifest(oid)
    assert excinfo.value.snapshot_id == oid


def test_manifests_are_hashable_by_content() -> None:
    a = manifest(key_groups={1: [CHUNK]})
    b = manifest(key_groups={1: (CHUNK,)})
    assert a == b and hash(a) == hash(b)
    assert len({a, b, manifest(epoch=2)}) == 2


_ids = st.text("0123456789abcdef", min_size=64, max_size=64)
_names = st.from_regex(
    r"[A-Za-z0-9][A-Za-z0-9._-]{0,8}(/[A-Za-z0-9][A-Za-z0-9_-]{0,8})?", fullmatch=True
)


@st.composite
def manifests(draw: st.DrawFn) -> Manifest:
    m = draw(st.integers(1, 64))
    branch = draw(_names.filter(lambda n: ".." not in n and not n.endswith(".lock")))
    return Manifest(
        branch=branch,
        epoch=draw(st.integers(0, 10**9)),
        parents=draw(st.lists(_ids, max_size=3, unique=True)),
        max_parallelism=m,
        parallelism=draw(st.integers(1, m)),
        kind=draw(st.sampled_from(sorted(COMMIT_KINDS))),
        key_groups=draw(
            st.dictionaries(st.integers(0, m - 1), st.lists(_ids, min_size=1, max_size=3))
        ),
        offsets=draw(
            st.dictionaries(
                st.text(min_size=1, max_size=5),
                st.dictionaries(st.text(min_size=1, max_size=3), st.integers(0, 2**62)),
                max_size=3,
            )
        ),
        outputs=draw(st.lists(_ids, max_size=3)),
        code_version=draw(st.text(max_size=10)),
        operation_id=draw(st.none() | st.text(max_size=10)),
        processing_time_ms=draw(st.integers(0, 2**50)),
        stats=draw(
            st.dictionaries(
                st.text(max_size=5),
                st.integers(-(2**50), 2**50) | st.floats(allow_nan=False, allow_infinity=False),
                max_size=3,
            )
        ),
        provenance=draw(st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2)),
        extra=draw(
            st.dictionaries(
                st.text(max_size=5),
                st.recursive(
                    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda inner: (
                        st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=3), inner, max_size=3)
                    ),
                    max_leaves=6,
                ),
                max_size=3,
            )
        ),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=manifests())
def test_any_valid_manifest_round_trips_canonically(m: Manifest) -> None:
    data = m.to_bytes()
    again = Manifest.from_bytes(data)
    assert again == m
    assert again.to_bytes() == data
    assert hash(again) == hash(m)
