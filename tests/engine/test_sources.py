"""Sources say whether they can still replay from a snapshot's offsets (`Source.retained`)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa

from runners.engine import sources
from runners.engine.sources import Generator, Source, write_jsonl_file, write_parquet_file


def test_parquet_directory_reports_deleted_and_shortened_files(tmp_path: Path) -> None:
    directory = str(tmp_path / "in")
    write_parquet_file(directory, "part-0000", pa.table({"key": ["a", "b", "c"]}))
    write_parquet_file(directory, "part-0001", pa.table({"key": ["d", "e"]}))
    source = sources.ParquetDirectory(directory)
    assert isinstance(source, Source)
    offsets = {"part-0000.parquet": 3, "part-0001.parquet": 1}
    assert source.retained({}) is None
    assert source.retained(offsets) is None
    write_parquet_file(directory, "part-0001", pa.table({"key": []}, pa.schema([("key", "str")])))
    problem = source.retained(offsets)
    assert problem is not None
    assert "part-0001.parquet" in problem and "has 0 rows" in problem and "read 1" in problem
    os.remove(os.path.join(directory, "part-0000.parquet"))
    problem = source.retained(offsets)
    assert problem is not None and problem.startswith("file part-0000.parquet was deleted")
    with open(os.path.join(directory, "part-0001.parquet"), "wb") as fh:
        fh.write(b"not parquet")
    problem = source.retained({"part-0001.parquet": 1})
    assert problem is not None and "cannot be read" in problem


def test_json_lines_directory_counts_bytes(tmp_path: Path) -> None:
    directory = str(tmp_path / "json")
    path = write_jsonl_file(directory, "part-0003", [{"user": "u1"}, {"user": "u2"}])
    size = os.path.getsize(path)
    source = sources.JsonLinesDirectory(directory, schema={"user": "string"})
    assert source.retained({"part-0003.jsonl": size}) is None
    assert source.retained({"part-0003.jsonl": size + 1}) is not None
    os.remove(path)
    problem = source.retained({"part-0003.jsonl": size})
    assert problem is not None and "file part-0003.jsonl was deleted" in problem


def test_generator_always_retains() -> None:
    assert Generator(keys=3, records_per_epoch=10).retained({"0": 10**9}) is None
