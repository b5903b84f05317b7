"""Deterministic Parquet epochs for the engine benchmark: one file per epoch.

Columns: ``key`` string, ``value`` long, ``ts`` long. Keys are ``k`` + a zero-padded id drawn
uniformly from ``[0, keys)`` (or, for the incremental part, every key once in epoch 1 and then a
fresh random set of distinct keys per epoch), values
uniformly from ``[0, 1_000_000)``. The random stream of epoch ``e`` is seeded by ``(seed, e)``
alone, so a file's contents never depend on how many epochs were generated. Files are written
in row groups of `ROW_GROUP_ROWS` rows.

`EpochSet.key_ids(e)` / `values(e)` regenerate an epoch's arrays in memory without reading the
file back: the reference checksums (bench/checksum.py) are computed from them, independently of
Spark and of the engine.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

VALUE_RANGE = 1_000_000
BASE_TS = 1_790_000_000_000  # ms; arbitrary fixed instant
SCHEMA = pa.schema([("key", pa.string()), ("value", pa.int64()), ("ts", pa.int64())])
SPARK_SCHEMA_DDL = "key STRING, value BIGINT, ts BIGINT"
#: Rows per Parquet row group (a 1M-record epoch file has 8): the unit in which a reader can
#: split a file — Spark's file scan and the engine's split routing both cut at row groups.
#: $EPOCHAL_BENCH_ROW_GROUP_ROWS overrides it (e.g. 1048576: one group per 1M-record file, as
#: pyarrow writes by default; neither Spark nor the engine can then divide a file's read).
ROW_GROUP_ROWS = int(os.environ.get("EPOCHAL_BENCH_ROW_GROUP_ROWS", str(1 << 17)))


def key_width(keys: int) -> int:
    return max(1, len(str(max(keys - 1, 0))))


def key_strings(keys: int) -> pa.StringArray:
    """All key strings ``k0000000 .. k{keys-1}``, indexable by key id."""
    width = key_width(keys)
    return pa.array([f"k{i:0{width}d}" for i in range(keys)], type=pa.string())


@dataclass
class EpochSet:
    """A directory of ``epoch-NNNNN.parquet`` files and the recipe that generated them."""

    directory: Path
    keys: int
    records: int
    epochs: int
    seed: int = 7
    # Incremental mode: epoch 1 writes every key once (a permutation of all keys); each later
    # epoch writes one record to each of `records` distinct keys chosen at random (e.g. 1%).
    incremental: bool = False
    row_group_rows: int = ROW_GROUP_ROWS
    _key_table: pa.StringArray | None = field(default=None, repr=False)
    _key_crc: np.ndarray | None = field(default=None, repr=False)

    @property
    def total_records(self) -> int:
        if self.incremental and self.epochs >= 1:
            return self.keys + self.records * (self.epochs - 1)
        return self.records * self.epochs

    def path(self, epoch: int) -> Path:
        return self.directory / f"epoch-{epoch:05d}.parquet"

    def files(self) -> list[Path]:
        return [self.path(e) for e in range(1, self.epochs + 1)]

    def key_table(self) -> pa.StringArray:
        if self._key_table is None:
            self._key_table = key_strings(self.keys)
        return self._key_table

    def key_crc(self) -> np.ndarray:
        """crc32 of each key's UTF-8 bytes, by key id (for the reference checksums)."""
        if self._key_crc is None:
            table = self.key_table().to_pylist()
            self._key_crc = np.fromiter(
                (zlib.crc32(k.encode()) for k in table), dtype=np.int64, count=len(table)
            )
        return self._key_crc

    def _rng(self, epoch: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, epoch])

    def key_ids(self, epoch: int) -> np.ndarray:
        rng = self._rng(epoch)
        if not self.incremental:
            return rng.integers(0, self.keys, self.records, dtype=np.int64)
        if epoch == 1:
            return rng.permutation(self.keys).astype(np.int64)
        return rng.choice(self.keys, size=self.records, replace=False).astype(np.int64)

    def values(self, epoch: int) -> np.ndarray:
        n = len(self.key_ids(epoch))
        rng = np.random.default_rng([self.seed, epoch, 1])
        return rng.integers(0, VALUE_RANGE, n, dtype=np.int64)

    def table(self, epoch: int) -> pa.Table:
        ids = self.key_ids(epoch)
        values = self.values(epoch)
        start = BASE_TS + epoch * 10_000_000
        ts = np.arange(start, start + len(ids), dtype=np.int64)
        keys = self.key_table().take(pa.array(ids))
        return pa.Table.from_arrays([keys, pa.array(values), pa.array(ts)], schema=SCHEMA)

    def generate(self) -> EpochSet:
        """Write every epoch file (skipping files already present); mtimes increase by epoch.

        Spark's file source orders files by modification time, so each file gets an explicit,
        strictly increasing mtime: `maxFilesPerTrigger=1` then reads epoch e in micro-batch e-1.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        base = 1_700_000_000
        for epoch in range(1, self.epochs + 1):
            target = self.path(epoch)
            if not target.exists():
                tmp = target.with_name(f".{target.name}.tmp")
                pq.write_table(
                    self.table(epoch),
                    tmp,
                    compression="snappy",
                    row_group_size=self.row_group_rows,
                )
                os.replace(tmp, target)
            os.utime(target, (base + epoch, base + epoch))
        return self

    def iter_arrays(self) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        for epoch in range(1, self.epochs + 1):
            yield epoch, self.key_ids(epoch), self.values(epoch)
