"""docs/benchmarks.md lists every committed benchmark result (no run left out) and links
only to results that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "benchmarks.md"
RESULTS = ROOT / "docs" / "bench"


def test_every_committed_result_is_named_on_the_benchmarks_page() -> None:
    text = PAGE.read_text()
    unlisted = sorted(p.name for p in RESULTS.iterdir() if p.name not in text)
    assert not unlisted, f"docs/benchmarks.md does not mention: {unlisted}"


def test_every_result_the_page_links_exists() -> None:
    linked = set(re.findall(r"\(bench/([^)#\s]+)\)", PAGE.read_text()))
    missing = sorted(name for name in linked if not (RESULTS / name).exists())
    assert not missing, f"docs/benchmarks.md links to missing results: {missing}"
