"""The machine-local state cache evicts oldest files above its budget, walking the directory
once per 1/16 of the budget written (not per a number of files)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

from runners import config
from runners.engine.state import disk_cache
from runners.engine.state.codec import KeyGroupState


def _budget(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    monkeypatch.setattr(config, "_current", replace(config.current(), state_cache_disk_bytes=size))


def _entry(i: int, rows: int = 2_000) -> KeyGroupState:
    table = pa.table(
        {"key": pa.array([f"k{i}-{r}" for r in range(rows)]), "n": pa.array(range(rows))}
    )
    return KeyGroupState((f"chunk-{i}",), table, (1,))


def _files(root: Path) -> list[Path]:
    return [Path(r) / n for r, _, names in os.walk(root) for n in names]


def test_disk_cache_evicts_oldest_above_budget_once_per_sixteenth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(config.STATE_CACHE_DIR_ENV, str(tmp_path))
    disk_cache.put(_entry(0))
    one = os.path.getsize(_files(tmp_path)[0])
    budget = one * 8  # room for 8 files; a pass after every half file's worth of bytes
    _budget(monkeypatch, budget)
    monkeypatch.setattr(disk_cache, "_written", 0)
    walks = []
    evict = disk_cache.evict
    monkeypatch.setattr(disk_cache, "evict", lambda: (walks.append(1), evict())[1])
    for i in range(1, 20):
        disk_cache.put(_entry(i))
    assert len(walks) == 19  # each file is more than 1/16 of this budget: one pass per put
    left = _files(tmp_path)
    assert sum(f.stat().st_size for f in left) <= budget
    assert 7 <= len(left) <= 8  # what fits, newest first
    assert Path(disk_cache.path_of(("chunk-19",))).exists()
    assert not Path(disk_cache.path_of(("chunk-1",))).exists()

    walks.clear()
    _budget(monkeypatch, one * 64)  # now 1/16 = 4 files
    monkeypatch.setattr(disk_cache, "_written", 0)
    for i in range(20, 32):
        disk_cache.put(_entry(i))
    assert len(walks) == 3  # after files 4, 8 and 12 of these 12
