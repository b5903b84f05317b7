"""Sources with explicit offsets: each epoch reads exactly ``[committed offsets, planned end)``.

A source names its partitions (a file name, a generator stream, a Kafka partition) and counts
an offset per partition. `plan` turns the committed offsets of the parent snapshot into the
splits of one epoch; `read` turns one split into an Arrow table plus dead letters. Both are
deterministic: planning the same offsets over the same input gives the same splits, which is
what makes a replay after a crash produce byte-identical chunks and outputs.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


@dataclass(frozen=True)
class Split:
    """One task's share of an epoch's input: ``[start, end)`` of one partition."""

    source: str
    partition: str
    start: int
    end: int
    locator: str = ""


@dataclass(frozen=True)
class DeadLetter:
    """A record that could not be processed, with where it came from and why."""

    source: str
    partition: str
    offset: int
    reason: str
    raw: str


@dataclass
class SplitData:
    """The records of a split, and the ones that were rejected while reading."""

    table: pa.Table
    dead_letters: list[DeadLetter] = field(default_factory=list)


@runtime_checkable
class Source(Protocol):
    """What the engine needs from a source (see docs/engine.md for adding Kafka)."""

    name: str

    def plan(self, committed: Mapping[str, int]) -> list[Split]:
        """Splits of the next epoch after `committed` (partition -> end offset); [] = no data."""
        ...

    def read(self, split: Split) -> SplitData:
        """The records of one split (runs inside a Spark task)."""
        ...

    def retained(self, offsets: Mapping[str, int]) -> str | None:
        """None when the source can still replay from `offsets` (partition -> offset, as in a
        manifest), else one sentence saying what is missing (e.g. a deleted file)."""
        ...


# -- optional capabilities ---------------------------------------------------------------------
# A source implements any of these beside `Source` (as Flink's table sources implement ability
# interfaces); the engine asks `isinstance(source, Capability)`, never probes for a method name.


@runtime_checkable
class PreparesEpochs(Protocol):
    """Reads the control document before each epoch is planned (a branch output source:
    re-pointing to another upstream branch)."""

    def prepare_epoch(self, control: Mapping[str, Any], epoch: int) -> None: ...


@runtime_checkable
class AdvancesOffsets(Protocol):
    """Computes the offsets after an epoch itself (offsets that are not row counts: stream
    ids, upstream epochs); without it `end_offsets` below."""

    def end_offsets(
        self, committed: Mapping[str, int], splits: Sequence[Split]
    ) -> dict[str, int]: ...


@runtime_checkable
class ReportsBacklog(Protocol):
    """Epochs of input waiting after `offsets` (None: cannot tell); manifest stat
    ``backlog_epochs``."""

    def backlog(self, offsets: Mapping[str, int]) -> int | None: ...


@runtime_checkable
class ReportsBacklogRecords(Protocol):
    """Records waiting after `offsets` (None: cannot tell); manifest stat
    ``backlog_records``."""

    def backlog_records(self, offsets: Mapping[str, int]) -> int | None: ...


@runtime_checkable
class RecordsLineage(Protocol):
    """What an epoch read, recorded in its manifest (``extra.inputs``): a branch output
    source's upstream epochs and snapshots (the cross-job mapping)."""

    def lineage(self, committed: Mapping[str, int], splits: Sequence[Split]) -> dict[str, Any]: ...


@runtime_checkable
class PartitionsEventTime(Protocol):
    """Names the watermark partition of each source partition (a Kafka partition, a stream):
    an event-time job's watermark is the minimum over them (runners/engine/eventtime). A
    source without it is one ordered stream."""

    def watermark_partition(self, partition: str) -> str: ...


@runtime_checkable
class PropagatesWatermarks(Protocol):
    """Reads the committed output of upstream jobs (a job web): names, per upstream the
    splits read, the watermark the newest upstream epoch among them recorded
    (``{"watermark": ms or None, "epoch": n}``; an upstream without event time is left out).
    An event-time job's watermark never passes its upstreams' (runners/engine/eventtime)."""

    def upstream_watermarks(self, splits: Sequence[Split]) -> dict[str, dict[str, Any]]: ...


@runtime_checkable
class Divisible(Protocol):
    """Cuts a split into up to `parts` contiguous pieces covering it in order (the split
    routing reads them in parallel); without it a split is read whole."""

    def divide(self, split: Split, parts: int) -> list[Split]: ...


#: every optional capability a source may have (docs/engine.md)
CAPABILITIES: tuple[type, ...] = (
    PreparesEpochs,
    AdvancesOffsets,
    ReportsBacklog,
    ReportsBacklogRecords,
    RecordsLineage,
    Divisible,
    PartitionsEventTime,
    PropagatesWatermarks,
)


def end_offsets(committed: Mapping[str, int], splits: Sequence[Split]) -> dict[str, int]:
    """The offsets after an epoch: committed offsets advanced by the splits read."""
    result = dict(committed)
    for split in splits:
        result[split.partition] = max(result.get(split.partition, 0), split.end)
    return result


def _files_retained(path: str, offsets: Mapping[str, int], unit: str, size: Any) -> str | None:
    """What is missing to replay a file directory from `offsets` (None: nothing)."""
    for file, offset in sorted(offsets.items()):
        full = os.path.join(path, file)
        if not os.path.exists(full):
            return (
                f"file {file} was deleted from {path} (the offsets had read {offset} {unit} "
                "of it), so a replay from these offsets cannot re-read it"
            )
        try:
            have = size(file)
        except (OSError, pa.ArrowException) as exc:
            return f"file {file} in {path} cannot be read any more ({exc})"
        if have < offset:
            return (
                f"file {file} in {path} has {have} {unit} but the offsets had read {offset}: "
                "it was truncated or replaced"
            )
    return None


def _ranges(start: int, end: int, size: int) -> list[tuple[int, int]]:
    return [(a, min(a + size, end)) for a in range(start, end, max(1, size))]


def balanced_pieces(start: int, end: int, cuts: Sequence[int], parts: int) -> list[tuple[int, int]]:
    """`[start, end)` as at most `parts` contiguous ranges whose bounds are taken from `cuts`
    (sorted, strictly inside the range): each bound is the cut nearest an equal share's end,
    kept only within half a share of it (so no piece is a sliver)."""
    bounds = [start]
    for k in range(1, max(1, parts)):
        target = start + (end - start) * k / parts
        best = min((c for c in cuts if c > bounds[-1]), key=lambda c: abs(c - target), default=None)
        if best is not None and best < end and abs(best - target) <= (end - start) / parts / 2:
            bounds.append(best)
    bounds.append(end)
    return list(itertools.pairwise(bounds))


def _data_files(path: str, suffix: str) -> list[str]:
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.endswith(suffix) and not n.startswith((".", "_")))


@dataclass
class ParquetDirectory:
    """An append-only directory of Parquet files; partition = file name, offset = rows read.

    Files must appear atomically (write elsewhere, then rename) and never change.
    """

    path: str
    max_files_per_epoch: int = 1
    rows_per_split: int = 1 << 20
    columns: Sequence[str] | None = None
    name: str = "files"
    _rows: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    def _num_rows(self, file: str) -> int:
        if file not in self._rows:
            self._rows[file] = pq.read_metadata(os.path.join(self.path, file)).num_rows
        return self._rows[file]

    def plan(self, committed: Mapping[str, int]) -> list[Split]:
        splits: list[Split] = []
        files = 0
        for file in _data_files(self.path, ".parquet"):
            if files >= self.max_files_per_epoch:
                break
            total = self._num_rows(file)
            start = committed.get(file, 0)
            if start >= total:
                continue
            files += 1
            for a, b in _ranges(start, total, self.rows_per_split):
                splits.append(Split(self.name, file, a, b, os.path.join(self.path, file)))
        return splits

    def backlog(self, offsets: Mapping[str, int]) -> int:
        """Epochs of input waiting after `offsets`: files with unread rows, per epoch."""
        waiting = sum(
            1
            for file in _data_files(self.path, ".parquet")
            if offsets.get(file, 0) < self._num_rows(file)
        )
        return -(-waiting // max(1, self.max_files_per_epoch))

    def backlog_records(self, offsets: Mapping[str, int]) -> int:
        """Rows waiting after `offsets`."""
        return sum(
            max(0, self._num_rows(file) - offsets.get(file, 0))
            for file in _data_files(self.path, ".parquet")
        )

    def divide(self, split: Split, parts: int) -> list[Split]:
        """`split` as up to `parts` contiguous pieces cut at row-group boundaries, so each
        piece reads only its own row groups (offsets are rows); one piece when the split lies
        within one row group."""
        meta = pq.read_metadata(split.locator)
        cuts, row = [], 0
        for i in range(meta.num_row_groups):
            row += meta.row_group(i).num_rows
            if split.start < row < split.end:
                cuts.append(row)
        return [
            Split(split.source, split.partition, a, b, split.locator)
            for a, b in balanced_pieces(split.start, split.end, cuts, parts)
        ]

    def read(self, split: Split) -> SplitData:
        pf = pq.ParquetFile(split.locator)
        groups, first, row = [], None, 0
        for i in range(pf.metadata.num_row_groups):
            n = pf.metadata.row_group(i).num_rows
            if row + n > split.start and row < split.end:
                groups.append(i)
                first = row if first is None else first
            row += n
        columns = list(self.columns) if self.columns is not None else None
        table = pf.read_row_groups(groups, columns=columns, use_threads=False)
        base = first or 0
        return SplitData(table.slice(split.start - base, split.end - split.start))

    def retained(self, offsets: Mapping[str, int]) -> str | None:
        def rows(file: str) -> int:
            return int(pq.read_metadata(os.path.join(self.path, file)).num_rows)

        return _files_retained(self.path, offsets, "rows", rows)


#: the record schema's type names (JSON-lines files and the log sources)
JSON_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "str": pa.string(),
    "int64": pa.int64(),
    "int": pa.int64(),
    "float64": pa.float64(),
    "float": pa.float64(),
    "bool": pa.bool_(),
}


def _coerce(value: Any, kind: pa.DataType) -> Any:
    """The value as `kind`, or raise ValueError naming the mismatch."""
    if value is None:
        return None
    if kind == pa.string():
        if isinstance(value, str):
            return value
    elif kind == pa.int64():
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind == pa.float64():
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif kind == pa.bool_() and isinstance(value, bool):
        return value
    raise ValueError(f"expected {kind}, got {type(value).__name__} {value!r}")


def decode_json_records(
    records: Iterable[tuple[int, bytes]],
    schema: Mapping[str, str],
    required: Sequence[str],
    source: str,
    partition: str,
) -> SplitData:
    """JSON objects `(offset, bytes)` as an Arrow table with the columns of `schema` (field ->
    string, int64, float64, bool); a record that is not a JSON object, lacks a `required`
    field or has a wrongly typed field becomes a dead letter at its offset."""
    types = {k: JSON_TYPES[v] for k, v in schema.items()}
    must = set(required)
    columns: dict[str, list[Any]] = {k: [] for k in types}
    dead: list[DeadLetter] = []
    for offset, raw in records:
        try:
            record = json.loads(raw)
            if not isinstance(record, dict):
                raise ValueError("a record must be a JSON object")
            row = {}
            for k, kind in types.items():
                value = record.get(k)
                if value is None and k in must:
                    raise ValueError(f"missing field {k!r}")
                try:
                    row[k] = _coerce(value, kind)
                except ValueError as exc:
                    raise ValueError(f"field {k!r}: {exc}") from None
        except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
            text = raw.decode("utf-8", "replace")
            dead.append(DeadLetter(source, partition, offset, str(exc), text))
            continue
        for k, v in row.items():
            columns[k].append(v)
    table = pa.table({k: pa.array(v, type=types[k]) for k, v in columns.items()})
    return SplitData(table, dead)


@dataclass
class JsonLinesDirectory:
    """An append-only directory of JSON-lines files; partition = file name, offset = bytes read.

    Only complete lines (ending in a newline) are read, so a file may grow while the job runs.
    `schema` maps field -> type (string, int64, float64, bool); `required` fields must be
    present and non-null (the key columns are always required). A line that is not a JSON
    object, lacks a required field or has a wrongly typed field becomes a dead letter.
    """

    path: str
    schema: Mapping[str, str]
    max_files_per_epoch: int = 1
    bytes_per_split: int = 32 * 1024 * 1024
    required: Sequence[str] = ()
    name: str = "files"

    def plan(self, committed: Mapping[str, int]) -> list[Split]:
        splits: list[Split] = []
        files = 0
        for file in _data_files(self.path, ".jsonl"):
            if files >= self.max_files_per_epoch:
                break
            full = os.path.join(self.path, file)
            start = committed.get(file, 0)
            with open(full, "rb") as fh:
                fh.seek(start)
                rest = fh.read()
            end = start + rest.rfind(b"\n") + 1
            if end <= start:
                continue
            files += 1
            a = start
            while a < end:
                b = min(a + self.bytes_per_split, end)
                if b < end:
                    nl = rest.find(b"\n", b - start - 1)
                    b = end if nl < 0 else start + nl + 1
                splits.append(Split(self.name, file, a, b, full))
                a = b
        return splits

    def backlog(self, offsets: Mapping[str, int]) -> int:
        """Epochs of input waiting after `offsets`: files grown past their offset, per epoch
        (a file holding only a partial line counts too)."""
        waiting = 0
        for file in _data_files(self.path, ".jsonl"):
            try:
                size = os.path.getsize(os.path.join(self.path, file))
            except OSError:
                continue
            waiting += offsets.get(file, 0) < size
        return -(-waiting // max(1, self.max_files_per_epoch))

    def read(self, split: Split, required: Sequence[str] = ()) -> SplitData:
        with open(split.locator, "rb") as fh:
            fh.seek(split.start)
            data = fh.read(split.end - split.start)
        lines: list[tuple[int, bytes]] = []
        pos = split.start
        for line in data.split(b"\n")[:-1]:
            offset, pos = pos, pos + len(line) + 1
            if line.strip():
                lines.append((offset, line))
        must = (*self.required, *required)
        return decode_json_records(lines, self.schema, must, split.source, split.partition)

    def retained(self, offsets: Mapping[str, int]) -> str | None:
        def size(file: str) -> int:
            return os.path.getsize(os.path.join(self.path, file))

        return _files_retained(self.path, offsets, "bytes", size)


@dataclass
class Generator:
    """Deterministic synthetic records ``{key, value, ts}`` for tests and benchmarks.

    Partition "0"; offset = records produced. Epoch b holds records ``[b*n, (b+1)*n)`` drawn
    from ``numpy.random.default_rng([seed, b])``: uniform keys ``key-<i>`` over `keys`,
    values 0..999, ``ts`` = record number. `epochs` bounds the stream (None = endless).
    """

    keys: int
    records_per_epoch: int
    seed: int = 0
    epochs: int | None = 10
    key_prefix: str = "key-"
    rows_per_split: int = 500_000
    name: str = "generator"

    def plan(self, committed: Mapping[str, int]) -> list[Split]:
        start = committed.get("0", 0)
        end = start + self.records_per_epoch - start % self.records_per_epoch
        if self.epochs is not None:
            end = min(end, self.epochs * self.records_per_epoch)
        return [Split(self.name, "0", a, b) for a, b in _ranges(start, end, self.rows_per_split)]

    def backlog(self, offsets: Mapping[str, int]) -> int | None:
        """Epochs left of a bounded stream (None for an endless one: always more input)."""
        if self.epochs is None:
            return None
        n = self.records_per_epoch
        return max(0, -(-(self.epochs * n - offsets.get("0", 0)) // n))

    def backlog_records(self, offsets: Mapping[str, int]) -> int | None:
        """Records left of a bounded stream (None for an endless one)."""
        if self.epochs is None:
            return None
        return max(0, self.epochs * self.records_per_epoch - offsets.get("0", 0))

    def block(self, index: int) -> pa.Table:
        """All records of generator epoch `index`."""
        rng = np.random.default_rng([self.seed, index])
        n = self.records_per_epoch
        key_ids = rng.integers(0, self.keys, n)
        values = rng.integers(0, 1000, n)
        keys = pc.binary_join_element_wise(
            self.key_prefix, pc.cast(pa.array(key_ids), pa.string()), ""
        )
        ts = np.arange(index * n, (index + 1) * n, dtype=np.int64)
        return pa.table({"key": keys, "value": pa.array(values), "ts": pa.array(ts)})

    def read(self, split: Split) -> SplitData:
        n = self.records_per_epoch
        index = split.start // n
        table = self.block(index)
        return SplitData(table.slice(split.start - index * n, split.end - split.start))

    def retained(self, offsets: Mapping[str, int]) -> str | None:
        """Always None: every record can be generated again."""
        return None


def _write_atomic(path: str, write: Any) -> None:
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def write_parquet_file(
    directory: str, name: str, table: pa.Table, row_group_size: int | None = None
) -> str:
    """Write one Parquet file into a source directory atomically (rename into place); row
    groups of `row_group_size` rows (pyarrow's default when None) are what the split routing
    divides a file's reading at."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name if name.endswith(".parquet") else name + ".parquet")
    _write_atomic(path, lambda tmp: pq.write_table(table, tmp, row_group_size=row_group_size))
    return path


def write_jsonl_file(directory: str, name: str, lines: Sequence[str | Mapping[str, Any]]) -> str:
    """Write one JSON-lines file atomically; a str line is written verbatim (for bad records)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name if name.endswith(".jsonl") else name + ".jsonl")

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            for line in lines:
                fh.write((line if isinstance(line, str) else json.dumps(line)) + "\n")

    _write_atomic(path, write)
    return path
