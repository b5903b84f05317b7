"""What the stream source tests publish and what the branch output must then hold."""

from __future__ import annotations

from typing import Any

import pandas as pd

from runners.engine import read_output
from snapshots_store import Repository


def records(n: int, first: int = 0) -> list[dict[str, Any]]:
    return [{"key": f"k{i % 7}", "value": i} for i in range(first, first + n)]


def totals(repo: Repository, branch: str = "main") -> dict[str, tuple[int, int]]:
    """Count and sum per key in the branch output's latest epoch for that key."""
    frame = read_output(repo, branch).to_pandas()
    last = frame.sort_values("_epoch").groupby("key").last()
    return {k: (int(r["count"]), int(r["sum_value"])) for k, r in last.iterrows()}


def expected(published: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """Count and sum per key over every published record, each once."""
    frame = pd.DataFrame(published).groupby("key")["value"].agg(["count", "sum"])
    return {k: (int(r["count"]), int(r["sum"])) for k, r in frame.iterrows()}
