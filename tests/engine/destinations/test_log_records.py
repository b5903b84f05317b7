"""The log sinks' row encoding: Arrow's vectorised formatting gives byte for byte what orjson
gives for each row's dict, and falls back to orjson for what it does not format."""

from __future__ import annotations

from decimal import Decimal

import orjson
import pyarrow as pa
import pytest

from runners.engine.destinations.log_records import generation, json_lines, position

TABLES = {
    "ints and plain strings": pa.table(
        {"key": ["k1", "é ü", None], "count": [1, None, 3], "ok": [True, False, None]}
    ),
    "a quote and a backslash": pa.table({"key": ['a"b', "c\\d", "e"], "n": [1, 2, 3]}),
    "control characters": pa.table({"key": pa.array(["x\ny", "t\tz"], pa.large_string())}),
    "floats and decimals": pa.table(
        {"f": [1.5, float("nan")], "d": pa.array([Decimal("1.20"), None], pa.decimal128(5, 2))}
    ),
    "uint64 and chunks": pa.table({"u": pa.chunked_array([[2**63], [0]], pa.uint64())}),
    "no rows": pa.table({"key": pa.array([], pa.string())}),
}


@pytest.mark.parametrize("name", list(TABLES))
def test_rows_encode_as_orjson_does(name: str) -> None:
    table = TABLES[name]
    assert json_lines(table) == [orjson.dumps(r, default=str) for r in table.to_pylist()]


def test_positions_and_generations() -> None:
    # epoch 3 of generation 0 starts at 3 * 10**12; the log's top there moves the generation
    # of a re-run epoch 2 (after a rollback) up by 2, but never below the parent's
    assert position(0, 3, 5) == 3 * 10**12 + 5
    assert generation(4, parent=0, top=position(0, 3, 99)) == 0
    assert generation(2, parent=0, top=position(0, 3, 99)) == 2
    assert generation(4, parent=1, top=position(0, 2, 0)) == 1
    assert generation(1, parent=0, top=0) == 0
