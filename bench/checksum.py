"""The per-epoch output checksum every benchmark variant must reproduce.

An epoch's output is one row per key changed in that epoch: ``key, count, sum_value,
max_value`` (running values for the stateful variants). Its checksum is

- ``rows``: number of output rows,
- ``sum_count``, ``sum_sum``, ``sum_max``: column sums,
- ``row_hash``: Σ h(row) with ``a = crc32(utf8(key))``,
  ``b = (count·1000003 + sum_value·8191 + max_value) mod P`` and
  ``h = ((a mod P)·b + a) mod P``, ``P = 2**31 - 1``.

`row_hash` does not depend on row order (a sum) but does depend on which key carries which
values (``h`` is not linear in the pair), so a value moved to the wrong key is caught even
when the column sums agree. All intermediates stay below 2⁶³, so the same integers come out of
numpy int64 and Python.

Two implementations of the same function: `checksum_arrow` (a pyarrow table: the engine's stored
outputs and the Parquet the Spark peers wrote, read after their timed windows) and the numpy
references computed straight from the generator's
arrays (`reference_running`, `reference_per_epoch`), independent of Spark and of the engine.
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from bench.datagen import EpochSet

P = 2_147_483_647
C_COUNT = 1_000_003
C_SUM = 8_191


@dataclass(frozen=True)
class Checksum:
    rows: int
    sum_count: int
    sum_sum: int
    sum_max: int
    row_hash: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def __str__(self) -> str:
        return (
            f"rows={self.rows} Σcount={self.sum_count} Σsum={self.sum_sum} "
            f"Σmax={self.sum_max} hash={self.row_hash}"
        )


EMPTY = Checksum(0, 0, 0, 0, 0)


def _row_hash(crc: np.ndarray, count: np.ndarray, sum_: np.ndarray, max_: np.ndarray) -> int:
    crc = crc.astype(np.int64)
    b = np.mod(count.astype(np.int64) * C_COUNT + sum_.astype(np.int64) * C_SUM + max_, P)
    h = np.mod(np.mod(crc, P) * b + crc, P)
    return int(h.sum(dtype=np.int64))


def from_arrays(crc: np.ndarray, count: np.ndarray, sum_: np.ndarray, max_: np.ndarray) -> Checksum:
    if len(count) == 0:
        return EMPTY
    return Checksum(
        rows=len(count),
        sum_count=int(count.sum(dtype=np.int64)),
        sum_sum=int(sum_.sum(dtype=np.int64)),
        sum_max=int(max_.sum(dtype=np.int64)),
        row_hash=_row_hash(crc, count, sum_, max_),
    )


def checksum_arrow(table: pa.Table | Any) -> Checksum:
    """The checksum of an Arrow table (or anything ``pa.table`` accepts) with the four columns."""
    table = pa.table(table) if not isinstance(table, pa.Table) else table
    if table.num_rows == 0:
        return EMPTY
    keys = table.column("key").to_pylist()
    crc = np.fromiter((zlib.crc32(k.encode()) for k in keys), dtype=np.int64, count=len(keys))

    def col(name: str) -> np.ndarray:
        return np.asarray(pc.cast(table.column(name), pa.int64()).to_numpy(), dtype=np.int64)

    return from_arrays(crc, col("count"), col("sum_value"), col("max_value"))


def reference_running(epochs: EpochSet) -> list[Checksum]:
    """Per-epoch checksums of the running aggregate, computed from the generator's arrays."""
    n = epochs.keys
    count = np.zeros(n, dtype=np.int64)
    total = np.zeros(n, dtype=np.int64)
    maximum = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    crc = epochs.key_crc()
    result = []
    for _epoch, ids, values in epochs.iter_arrays():
        count += np.bincount(ids, minlength=n)
        np.add.at(total, ids, values)
        np.maximum.at(maximum, ids, values)
        changed = np.unique(ids)
        result.append(from_arrays(crc[changed], count[changed], total[changed], maximum[changed]))
    return result


def reference_per_epoch(epochs: EpochSet) -> list[Checksum]:
    """Per-epoch checksums of each epoch's own aggregate (no state): the stateless variant."""
    crc = epochs.key_crc()
    result = []
    for _epoch, ids, values in epochs.iter_arrays():
        changed, inverse = np.unique(ids, return_inverse=True)
        count = np.bincount(inverse, minlength=len(changed)).astype(np.int64)
        total = np.zeros(len(changed), dtype=np.int64)
        np.add.at(total, inverse, values)
        maximum = np.full(len(changed), np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(maximum, inverse, values)
        result.append(from_arrays(crc[changed], count, total, maximum))
    return result


def compare(
    name: str, got: list[Checksum], expected: list[Checksum], expected_name: str
) -> list[str]:
    """Human-readable mismatches between two per-epoch checksum lists (empty: they agree)."""
    problems = []
    if len(got) != len(expected):
        problems.append(f"{name}: {len(got)} epochs of output, {expected_name} has {len(expected)}")
    for i, (a, b) in enumerate(zip(got, expected, strict=False), start=1):
        if a != b:
            problems.append(f"{name} epoch {i}: {a}  !=  {expected_name}: {b}")
    return problems
