"""Rows combined per key and window, with numpy over one sort (a hash aggregation's fixed cost
per call would dominate the many small key groups of a reducer).

Fixed windows (tumbling, sliding) group rows by (key code, window start). Session windows
merge intervals: rows sorted by (key code, start), a row opens a new session when its key
differs from the previous row's or its start lies after the largest end so far of its key
(a cumulative maximum of the ends) — an interval that starts exactly where another ends joins
it, as Spark's ``MergingSessionsIterator`` (``start <= end``). Merging intervals is
associative and commutative, so sessions merged per split and merged again per key group are
the sessions of all the rows at once, whatever the routing or the parallelism.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa


class Groups(NamedTuple):
    """Combined rows, sorted by (code, start): their code, window start and end, whether any
    of their rows was new, each column combined, and the index of each group's first row."""

    codes: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    changed: np.ndarray
    values: dict[str, pa.Array]
    firsts: np.ndarray


def fixed_windows(
    size: int,
    slide: int,
    codes: np.ndarray,
    starts: np.ndarray,
    new: np.ndarray,
    columns: dict[str, tuple[pa.Array, str]],
) -> Groups:
    """Rows combined per (code, window start) of windows `size` long starting every `slide`."""
    # one int64 sort key: windows of a code are slides apart (the sort is deterministic for
    # the same rows, whatever the parallelism or routing that brought them)
    slots = (starts - starts.min(initial=0)) // slide if len(starts) else starts
    order = np.argsort(codes * (int(slots.max(initial=0)) + 1) + slots)
    codes, starts = codes[order], starts[order]
    edge = np.ones(len(codes), dtype=bool)
    edge[1:] = (codes[1:] != codes[:-1]) | (starts[1:] != starts[:-1])
    first = np.flatnonzero(edge)
    return _groups(codes, starts, starts + size, new, columns, order, first, first)


def sessions(
    codes: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    new: np.ndarray,
    columns: dict[str, tuple[pa.Array, str]],
) -> Groups:
    """Intervals ``[start, end)`` merged per code into sessions (see the module docstring)."""
    n = len(codes)
    order = np.lexsort((starts, codes))
    codes, starts, ends = codes[order], starts[order], ends[order]
    # dense ranks keep the order of starts and ends; code * scale + rank keeps the running
    # maximum of one code's ends from leaking into the next code (without overflow)
    inverse = np.unique(np.concatenate([starts, ends]), return_inverse=True)[1].reshape(-1)
    scale = np.int64(2 * n + 1)
    base = codes.astype(np.int64) * scale
    running = np.maximum.accumulate(base + inverse[n:]) if n else base
    edge = np.ones(n, dtype=bool)
    edge[1:] = (codes[1:] != codes[:-1]) | (base[1:] + inverse[1:n] > running[:-1])
    first = np.flatnonzero(edge)
    session_ends = np.maximum.reduceat(ends, first) if n else ends
    return _groups(codes, starts, session_ends, new, columns, order, first, np.arange(len(first)))


def _groups(
    codes: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    new: np.ndarray,
    columns: dict[str, tuple[pa.Array, str]],
    order: np.ndarray,
    first: np.ndarray,
    end_at: np.ndarray,
) -> Groups:
    """The groups that begin at the sorted rows `first` (`ends[end_at]`: each group's end)."""
    if not len(first):
        empty = {name: column.slice(0, 0) for name, (column, _) in columns.items()}
        return Groups(codes, starts, ends, new.astype(bool)[:0], empty, first)
    changed = np.maximum.reduceat(new[order], first).astype(bool)
    values = {name: _combine(column.take(pa.array(order)), function, first)
              for name, (column, function) in columns.items()}  # fmt: skip
    return Groups(codes[first], starts[first], ends[end_at], changed, values, order[first])


def _combine(column: pa.Array, function: str, first: np.ndarray) -> pa.Array:
    """The sorted column combined per group (sum, min or max; null when every value of the
    group is null)."""
    valid = np.asarray(column.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    numeric = np.iinfo if pa.types.is_integer(column.type) else np.finfo
    dtype = column.type.to_pandas_dtype()
    identity = {"sum": 0, "min": numeric(dtype).max, "max": numeric(dtype).min}[function]
    values = np.asarray(column.fill_null(identity).to_numpy(), dtype=dtype)
    reduce = {"sum": np.add, "min": np.minimum, "max": np.maximum}[function]
    present = np.logical_or.reduceat(valid, first)
    return pa.array(reduce.reduceat(values, first), mask=~present, type=column.type)
