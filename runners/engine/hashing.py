"""Vectorised canonical key bytes and murmur3_x86_32 over Arrow columns (numpy, no per-row Python).

`key_hashes` equals ``mmh3.hash(canonical_bytes(k), 0, signed=False)`` for every row; the tests
check it against mmh3 on random unicode and binary strings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

U32 = np.uint32
_C1 = U32(0xCC9E2D51)
_C2 = U32(0x1B873593)
_N = U32(0xE6546B64)
_F1 = U32(0x85EBCA6B)
_F2 = U32(0xC2B2AE35)

Offsets = npt.NDArray[np.int64]
Bytes = npt.NDArray[np.uint8]
Hashes = npt.NDArray[np.uint32]


@dataclass(frozen=True)
class VarBinary:
    """n variable-length byte strings: row i is ``data[offsets[i]:offsets[i+1]]``."""

    offsets: Offsets
    data: Bytes

    @property
    def lengths(self) -> Offsets:
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1


def _rotl(x: Hashes, r: int) -> Hashes:
    return (x << U32(r)) | (x >> U32(32 - r))


def _gather_u32(data: Bytes, pos: Offsets) -> Hashes:
    b = data
    return (  # type: ignore[no-any-return]
        b[pos].astype(U32)
        | (b[pos + 1].astype(U32) << U32(8))
        | (b[pos + 2].astype(U32) << U32(16))
        | (b[pos + 3].astype(U32) << U32(24))
    )


def _block(h: Hashes, k: Hashes) -> Hashes:
    k *= _C1
    k = _rotl(k, 15)
    k *= _C2
    h = h ^ k
    h = _rotl(h, 13)
    return h * U32(5) + _N


def murmur3_32(values: VarBinary, seed: int = 0) -> Hashes:
    """murmur3_x86_32 of every row, as uint32 (equal to ``mmh3.hash(row, seed, signed=False)``)."""
    n = len(values)
    offsets = values.offsets[:-1]
    lengths = values.lengths
    data = np.concatenate([values.data, np.zeros(4, dtype=np.uint8)])
    h = np.full(n, seed & 0xFFFFFFFF, dtype=U32)
    nblocks = lengths // 4
    with np.errstate(over="ignore"):
        max_blocks = int(nblocks.max(initial=0))
        if n and max_blocks > 0:
            if int(lengths.min()) == int(lengths.max()):  # common: every key the same length
                # the rows are contiguous: view their whole blocks as little-endian words (one
                # copy) instead of gathering four bytes per block and row
                width = int(lengths[0])
                first = int(offsets[0])
                rows = data[first : first + n * width].reshape(n, width)
                words = np.array(rows[:, : 4 * max_blocks]).view("<u4")
                for j in range(max_blocks):
                    h = _block(h, words[:, j].astype(U32))
            elif int(nblocks.min()) == max_blocks:  # same number of whole blocks
                for j in range(max_blocks):
                    h = _block(h, _gather_u32(data, offsets + 4 * j))
            else:
                # Rows sorted by block count (descending): at block j the active rows are a prefix.
                order = np.argsort(-nblocks, kind="stable")
                sorted_offsets = offsets[order]
                hs = h[order]
                active = np.searchsorted(-nblocks[order], -np.arange(1, max_blocks + 1) + 0.5)
                for j in range(max_blocks):
                    a = int(active[j])
                    hs[:a] = _block(hs[:a], _gather_u32(data, sorted_offsets[:a] + 4 * j))
                h[order] = hs
        rem = lengths & 3
        tail = offsets + nblocks * 4
        k1 = np.zeros(n, dtype=U32)
        m3 = rem >= 3
        k1[m3] ^= data[tail[m3] + 2].astype(U32) << U32(16)
        m2 = rem >= 2
        k1[m2] ^= data[tail[m2] + 1].astype(U32) << U32(8)
        m1 = rem >= 1
        k1[m1] ^= data[tail[m1]].astype(U32)
        k1 *= _C1
        k1 = _rotl(k1, 15)
        k1 *= _C2
        h = np.where(m1, h ^ k1, h)
        h ^= lengths.astype(U32)
        h ^= h >> U32(16)
        h *= _F1
        h ^= h >> U32(13)
        h *= _F2
        h ^= h >> U32(16)
    return h


# -- canonical bytes of Arrow columns ------------------------------------------------------


def _fixed(prefix: bytes, body: npt.NDArray[np.uint8]) -> VarBinary:
    """Rows of `prefix` + one fixed-width row of `body` (shape n x w)."""
    n = body.shape[0]
    pre = np.frombuffer(prefix, dtype=np.uint8)
    rows = np.empty((n, len(pre) + body.shape[1]), dtype=np.uint8)
    rows[:, : len(pre)] = pre
    rows[:, len(pre) :] = body
    width = rows.shape[1]
    return VarBinary(np.arange(n + 1, dtype=np.int64) * width, rows.reshape(-1))


def _binary_buffers(array: pa.Array) -> VarBinary:
    """Offsets and data of a (large_)string/binary array without copying the data."""
    if pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type):
        off_type: type[np.integer[Any]] = np.int64
    else:
        off_type = np.int32
    buffers = array.buffers()
    n = len(array)
    raw_offsets = np.frombuffer(buffers[1], dtype=off_type)[array.offset : array.offset + n + 1]
    offsets = raw_offsets.astype(np.int64)
    data = (
        np.frombuffer(buffers[2], dtype=np.uint8)
        if buffers[2] is not None
        else np.zeros(0, np.uint8)
    )
    return VarBinary(offsets, data)


def concat_rows(parts: Sequence[VarBinary]) -> VarBinary:
    """Row-wise concatenation of several VarBinary columns of equal length."""
    n = len(parts[0])
    lengths = [p.lengths for p in parts]
    total = np.sum(lengths, axis=0) if n else np.zeros(0, np.int64)
    out_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(total, out=out_offsets[1:])
    out = np.empty(int(out_offsets[-1]), dtype=np.uint8)
    cursor = out_offsets[:-1].copy()
    for part, plen in zip(parts, lengths, strict=True):
        start, stop = int(part.offsets[0]), int(part.offsets[-1])
        size = stop - start
        if size:
            within = np.arange(size, dtype=np.int64) - np.repeat(part.offsets[:-1] - start, plen)
            dest = np.repeat(cursor, plen) + within
            out[dest] = part.data[start:stop]
        cursor += plen
    return VarBinary(out_offsets, out)


def canonical_column(array: pa.Array | pa.ChunkedArray) -> VarBinary:
    """Canonical bytes (runners.engine.keys) of every row of a non-null key column."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    t = array.type
    if pa.types.is_dictionary(t):
        array = array.dictionary_decode()
        t = array.type
    n = len(array)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _binary_buffers(array)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return concat_rows(
            [_fixed(b"\xff\x04", np.zeros((n, 0), np.uint8)), _binary_buffers(array)]
        )
    if pa.types.is_boolean(t):
        body = np.asarray(array.to_numpy(zero_copy_only=False), dtype=np.uint8).reshape(n, 1)
        return _fixed(b"\xff\x01", body)
    if pa.types.is_integer(t):
        if pa.types.is_uint64(t):
            values = array.to_numpy(zero_copy_only=False)
            if n and int(values.max()) > 2**63 - 1:
                raise ValueError("uint64 keys above 2**63-1 are not supported by the vector path")
        ints = np.asarray(array.to_numpy(zero_copy_only=False), dtype=np.int64)
        body = ints.astype(">i8").view(np.uint8).reshape(n, 8)
        return _fixed(b"\xff\x02", body)
    if pa.types.is_null(t):
        return _fixed(b"\xff\x00", np.zeros((n, 0), np.uint8))
    raise TypeError(f"key columns of type {t} are not supported (str, int, bytes, bool)")


def canonical_keys(columns: Sequence[pa.Array | pa.ChunkedArray]) -> VarBinary:
    """Canonical bytes of keys made of one column, or a tuple of several columns."""
    if len(columns) == 1:
        return canonical_column(columns[0])
    encoded = [canonical_column(c) for c in columns]
    n = len(encoded[0])
    header = _fixed(
        b"\xff\x05", np.tile(np.frombuffer(len(columns).to_bytes(4, "big"), np.uint8), (n, 1))
    )
    parts: list[VarBinary] = [header]
    for e in encoded:
        lens = e.lengths.astype(">u4").view(np.uint8).reshape(n, 4)
        parts.append(_fixed(b"", lens))
        parts.append(e)
    return concat_rows(parts)


def key_hashes(columns: Sequence[pa.Array | pa.ChunkedArray]) -> Hashes:
    """murmur3_x86_32 (seed 0, unsigned) of the canonical bytes of every key."""
    return murmur3_32(canonical_keys(columns))


def key_groups(
    columns: Sequence[pa.Array | pa.ChunkedArray], max_parallelism: int
) -> npt.NDArray[np.int32]:
    """Key group of every row."""
    return (key_hashes(columns) % U32(max_parallelism)).astype(np.int32)


def owners(
    groups: npt.NDArray[np.int32], parallelism: int, max_parallelism: int
) -> npt.NDArray[np.int32]:
    """Owning task of every key group: floor(g*p/M), vectorised."""
    return ((groups.astype(np.int64) * parallelism) // max_parallelism).astype(np.int32)
