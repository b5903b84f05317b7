"""Key groups: Flink's range arithmetic (exhaustive), canonical key bytes, vectorised murmur3."""

from __future__ import annotations

import subprocess
import sys

import mmh3
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runners.engine.hashing import key_groups, key_hashes
from runners.engine.keygroups import (
    KeyGroupError,
    check_parallelism,
    hash_key,
    key_group_of,
    key_group_range,
    key_group_ranges,
    operator_index,
    range_bounds,
)
from runners.engine.keys import UnsupportedKeyError, canonical_bytes


def test_ranges_are_disjoint_contiguous_complete_and_balanced_for_all_p_le_m_le_512() -> None:
    for m in range(1, 513):
        groups = np.arange(m)
        for p in range(1, m + 1):
            starts, ends = range_bounds(p, m)
            assert starts[0] == 0 and ends[-1] == m - 1  # complete
            assert np.array_equal(starts[1:], ends[:-1] + 1)  # contiguous and disjoint
            sizes = ends - starts + 1
            assert sizes.min() >= 1 and sizes.max() - sizes.min() <= 1  # balanced
            # owner(g) = floor(g*p/M) agrees with the ranges
            owner = groups * p // m
            assert np.array_equal(np.repeat(np.arange(p), sizes), owner)


def test_scalar_functions_agree_with_all_ranges_up_to_m_128() -> None:
    for m in range(1, 129):
        for p in range(1, m + 1):
            ranges = key_group_ranges(p, m)
            starts, ends = range_bounds(p, m)
            assert [(r.start, r.end) for r in ranges] == list(zip(starts, ends, strict=True))
            for i in range(p):
                assert key_group_range(i, p, m) == ranges[i]
            assert [operator_index(g, p, m) for g in range(m)] == [
                i for i, r in enumerate(ranges) for _ in r
            ]


def test_operator_index_matches_ranges_spot_check_large_m() -> None:
    m = 32768
    for p in (1, 3, 7, 1000, 32768):
        for i in (0, p // 2, p - 1):
            r = key_group_range(i, p, m)
            assert operator_index(r.start, p, m) == i
            assert operator_index(r.end, p, m) == i


def test_flink_example_m128_p3() -> None:
    assert [(r.start, r.end) for r in (key_group_range(i, 3, 128) for i in range(3))] == [
        (0, 42),
        (43, 85),
        (86, 127),
    ]


def test_parallelism_above_max_parallelism_is_refused() -> None:
    with pytest.raises(KeyGroupError, match=r"exceeds the lineage's max parallelism 128"):
        check_parallelism(129, 128)
    with pytest.raises(KeyGroupError):
        key_group_range(0, 0, 128)
    with pytest.raises(KeyGroupError, match=r"outside 1\.\.32768"):
        check_parallelism(1, 32769)


def test_canonical_bytes_encoding_is_the_documented_one() -> None:
    assert canonical_bytes("ab") == b"ab"
    assert canonical_bytes("é") == "é".encode()
    assert canonical_bytes(None) == b"\xff\x00"
    assert canonical_bytes(True) == b"\xff\x01\x01"
    assert canonical_bytes(False) == b"\xff\x01\x00"
    assert canonical_bytes(1) == b"\xff\x02" + (1).to_bytes(8, "big")
    assert canonical_bytes(-1) == b"\xff\x02" + b"\xff" * 8
    assert canonical_bytes(2**64) == b"\xff\x03\x01" + b"\x00" * 8
    assert canonical_bytes(b"x") == b"\xff\x04x"
    assert canonical_bytes(("a", 1)) == (
        b"\xff\x05\x00\x00\x00\x02"
        + b"\x00\x00\x00\x01a"
        + b"\x00\x00\x00\x0a\xff\x02"
        + (1).to_bytes(8, "big")
    )
    with pytest.raises(UnsupportedKeyError):
        canonical_bytes(1.5)


# Frozen values: the key-group function is part of the snapshot format and must never change.
GOLDEN = {"user-1": 99, "": 0, "ü": 42, 42: 114, ("a", 1): 57}


def test_key_groups_are_frozen() -> None:
    assert {k: key_group_of(k, 128) for k in GOLDEN} == GOLDEN


def test_hashes_are_stable_across_processes() -> None:
    code = (
        "from runners.engine.keygroups import hash_key;"
        "print([hash_key(k) for k in ['user-1', '', 'ü', 42, ('a', 1), b'z', None, True]])"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": str(seed), "PYTHONPATH": "."},
        ).stdout
        for seed in (1, 2)
    }
    expected = [hash_key(k) for k in ["user-1", "", "ü", 42, ("a", 1), b"z", None, True]]
    assert outs == {f"{expected}\n"}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=200))
def test_vectorised_hash_equals_mmh3_on_unicode(values: list[str]) -> None:
    got = key_hashes([pa.array(values, type=pa.string())])
    assert got.tolist() == [mmh3.hash(v.encode(), 0, signed=False) for v in values]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=70), max_size=200))
def test_vectorised_hash_equals_mmh3_on_binary(values: list[bytes]) -> None:
    got = key_hashes([pa.array(values, type=pa.binary())])
    assert got.tolist() == [mmh3.hash(canonical_bytes(v), 0, signed=False) for v in values]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.text(max_size=12), st.integers(-(2**63), 2**63 - 1)), min_size=1, max_size=50
    )
)
def test_vectorised_tuple_and_int_keys_equal_scalar_path(rows: list[tuple[str, int]]) -> None:
    a = pa.array([r[0] for r in rows])
    b = pa.array([r[1] for r in rows], type=pa.int64())
    assert key_hashes([a, b]).tolist() == [hash_key(r) for r in rows]
    assert key_hashes([b]).tolist() == [hash_key(r[1]) for r in rows]
    groups = key_groups([a, b], 128)
    assert groups.tolist() == [key_group_of(r, 128) for r in rows]


def test_vectorised_hash_on_sliced_and_large_string_arrays() -> None:
    values = [f"k{i}" * (i % 7) for i in range(500)]
    arr = pa.array(values).slice(37, 300)
    assert key_hashes([arr]).tolist() == [
        mmh3.hash(v.encode(), 0, signed=False) for v in values[37:337]
    ]
    large = pa.array(values, type=pa.large_string())
    assert key_hashes([large]).tolist() == [mmh3.hash(v.encode(), 0, signed=False) for v in values]
    chunked = pa.chunked_array([values[:100], values[100:]])
    assert np.array_equal(key_hashes([chunked]), key_hashes([pa.array(values)]))


@pytest.mark.parametrize("width", [1, 4, 7, 8, 9, 12])
def test_vectorised_hash_on_equal_length_keys(width: int) -> None:
    """Keys of one length (the contiguous fast path), whole arrays and slices."""
    values = [f"{i:0{width}d}"[-width:] for i in range(500)]
    array = pa.array(values)
    expected = [mmh3.hash(v.encode(), 0, signed=False) for v in values]
    assert key_hashes([array]).tolist() == expected
    assert key_hashes([array.slice(13, 200)]).tolist() == expected[13:213]
