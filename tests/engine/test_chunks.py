"""Materialising chains whose chunks have different columns (forks, state migrations)."""

from __future__ import annotations

import pyarrow as pa

from runners.engine.state.codec import apply_delta, with_deleted


def test_a_delta_with_other_columns_conforms_the_kept_rows_to_its_columns() -> None:
    base = pa.table({"key": ["a", "b", "c"], "count": [1, 2, 3], "dropped": [9, 9, 9]})
    delta = with_deleted(pa.table({"key": ["b"], "count": [5], "added": [7]}))
    result = apply_delta(base, delta, ["key"])
    assert result.column_names == ["key", "count", "added"]
    assert result.to_pylist() == [
        {"key": "a", "count": 1, "added": None},
        {"key": "c", "count": 3, "added": None},
        {"key": "b", "count": 5, "added": 7},
    ]
    gone = with_deleted(pa.table({"key": ["a"], "count": [0], "added": [0]}), None)
    gone = gone.set_column(3, "_deleted", pa.array([True]))
    assert apply_delta(result, gone, ["key"]).column("key").to_pylist() == ["c", "b"]
