"""The machine-local state cache evicts oldest files above its budget, walking the directory
once per 1/16 of the budget written (not per a number of files)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from runners.engine import chunks


def _entry(i: int, rows: int = 2_000) -> chunks.KeyGroupState:
    table = pa.table(
        {"key": pa.array([f"k{i}-{r}" for r in range(rows)]), "n": pa.array(range(rows))}
    )
    return chunks.KeyGroupState((f"chunk-{i}",), table, (1,))


def _files(root: Path) -> list[Path]:
    return [Path(r) / n for r, _, names in os.walk(root) for n in names]


def test_disk_cache_evicts_oldest_above_budget_once_per_sixteenth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(chunks.DISK_CACHE_ENV, str(tmp_path))
    chunks._disk_put(_entry(0))
    one = os.path.getsize(_files(tmp_path)[0])
    budget = one * 8  # room for 8 files; a pass after every half file's worth of bytes
    monkeypatch.setattr(chunks, "DISK_CACHE_BYTES", budget)
    monkeypatch.setattr(chunks, "_disk_written", 0)
    walks = []
    evict = chunks._disk_evict
    monkeypatch.setattr(chunks, "_disk_evict", lambda: (walks.append(1), evict())[1])
    for i in range(1, 20):
        chunks._disk_put(_entry(i))
    assert len(walks) == 19  # each file is more than 1/16 of this budget: one pass per put
    left = _files(tmp_path)
    assert sum(f.stat().st_size for f in left) <= budget
    assert 7 <= len(left) <= 8  # what fits, newest first
    assert Path(chunks._disk_path(("chunk-19",))).exists()
    assert not Path(chunks._disk_path(("chunk-1",))).exists()

    walks.clear()
    monkeypatch.setattr(chunks, "DISK_CACHE_BYTES", one * 64)  # now 1/16 = 4 files
    monkeypatch.setattr(chunks, "_disk_written", 0)
    for i in range(20, 32):
        chunks._disk_put(_entry(i))
    assert len(walks) == 3  # after files 4, 8 and 12 of these 12
