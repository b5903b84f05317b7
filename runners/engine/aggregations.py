"""Vectorised built-in aggregations: partial aggregates per epoch, merged into running state.

Each aggregation keeps one state column (its output column, e.g. ``sum_value``), computes a
partial with pyarrow's hash aggregation over an epoch's records, combines partials of several
input splits, and merges a partial into the running value — never calling Python per record.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class Aggregation:
    """One running aggregate: `kind` over `column`, kept in state column `name`."""

    kind: str
    column: str | None = None

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
