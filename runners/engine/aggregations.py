"""Vectorised built-in aggregations: partial aggregates per epoch, merged into running state.

Each aggregation keeps one state column (its output column, e.g. ``sum_value``), computes a
partial with pyarrow's hash aggregation over an epoch's records, combines partials of several
input splits, and merges a partial into the running value — never calling Python per record.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class Aggregation:
    """One running aggregate: `kind` over `column`, kept in state column `name`."""

    kind: str
    column: str | None = None
    width: int | None = None

    @property
    def name(self) -> str:
        return self.kind if self.column is None else f"{self.kind}_{self.column}"

    def partial(self) -> tuple[str | list[str], str]:
        """(input column(s), pyarrow hash function) of the per-epoch partial aggregate."""
        if self.kind == "count":
            return ([], "count_all")
        assert self.column is not None
        return (self.column, {"sum": "sum", "min": "min", "max": "max", "last": "last"}[self.kind])

    def partial_column(self) -> str:
        """Name pyarrow gives the partial's result column."""
        if self.kind == "count":
            return "count_all"
        return f"{self.column}_{self.partial()[1]}"

    def combine(self) -> str:
        """Hash function that combines two partials (of different input splits)."""
        return {"count": "sum", "sum": "sum", "min": "min", "max": "max", "last": "last"}[self.kind]

    def merge(self, old: pa.Array, new: pa.Array) -> pa.Array:
        """Running value after an epoch: `old` (null = no state yet) merged with partial `new`."""
        if self.kind in ("count", "sum"):
            summed = pc.add(old, new)
            return pc.coalesce(summed, new, old)
        if self.kind == "min":
            return pc.min_element_wise(old, new, skip_nulls=True)
        if self.kind == "max":
            return pc.max_element_wise(old, new, skip_nulls=True)
        return pc.coalesce(new, old)


def count() -> Aggregation:
    """Number of records per key."""
    return Aggregation("count")


def sum(column: str) -> Aggregation:
    """Sum of a numeric column per key (nulls skipped)."""
    return Aggregation("sum", column)


def min(column: str) -> Aggregation:
    """Minimum of a column per key."""
    return Aggregation("min", column)


def max(column: str) -> Aggregation:
    """Maximum of a column per key."""
    return Aggregation("max", column)


def last(column: str) -> Aggregation:
    """Last non-null value of a column per key, in input order."""
    return Aggregation("last", column)


# -- aggregations with more than one state column ----------------------------------------
#
# distinct_count keeps the sorted set of distinct values (a list column ``_<name>_set``);
# windowed_count keeps the start of the key's latest event-time window (``_<name>_window``)
# and the number of records in it. Both are computed with numpy over group codes, never
# per record in Python.

SPECIAL = ("distinct_count", "windowed_count")


def distinct_count(column: str) -> Aggregation:
    """Exact number of distinct values of a column per key (keeps the set in state)."""
    return Aggregation("distinct_count", column)


def windowed_count(ts_column: str, width: int) -> Aggregation:
    """Records of the key in its latest tumbling event-time window of `width` (same unit as
    the timestamp column); the window start is kept beside it. Records older than the key's
    current window are ignored (late)."""
    if width <= 0:
        raise ValueError("a window width must be positive")
    return Aggregation("windowed_count", ts_column, width)


def aux_column(agg: Aggregation) -> str:
    """The second state column of a distinct or windowed count."""
    return f"_{agg.name}_set" if agg.kind == "distinct_count" else f"_{agg.name}_window"


def sorted_sets(rows: np.ndarray, values: pa.Array, n_rows: int) -> pa.Array:
    """One sorted list of distinct values per row from (row, value) pairs."""
    pairs = pa.table({"r": pa.array(rows, type=pa.int64()), "v": values})
    pairs = pairs.group_by(["r", "v"], use_threads=False).aggregate([])
    pairs = pairs.sort_by([("r", "ascending"), ("v", "ascending")])
    counts = np.bincount(pairs.column("r").to_numpy(), minlength=n_rows)
    offsets = np.zeros(n_rows + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pairs.column("v").combine_chunks())


def union_sets(codes: np.ndarray, lists: pa.Array, n_rows: int) -> pa.Array:
    """Per code, the sorted union of the lists of the rows carrying that code."""
    flat = pc.list_flatten(lists)
    parents = pc.list_parent_indices(lists).to_numpy()
    return sorted_sets(np.asarray(codes)[parents], flat, n_rows)


def latest_window(
    codes: np.ndarray, windows: np.ndarray, counts: np.ndarray, n_rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per code, the latest window and the summed count of the rows in exactly that window."""
    latest = np.full(n_rows, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(latest, codes, windows)
    in_latest = windows == latest[codes]
    total = np.bincount(codes[in_latest], weights=counts[in_latest], minlength=n_rows)
    return latest, total.astype(np.int64)
