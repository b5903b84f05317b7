"""docs/benchmarks.md starts with one table of every figure's current value (target, verdict,
date, load), names every committed benchmark result (no run left out; the day-by-day history
under docs/bench/ too) and links only to results that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "benchmarks.md"
RESULTS = ROOT / "docs" / "bench"
HISTORY = sorted(RESULTS.glob("results-*.md"))


def test_every_committed_result_is_named_on_the_benchmarks_page() -> None:
    text = PAGE.read_text()
    unlisted = sorted(p.name for p in RESULTS.iterdir() if p.name not in text)
    assert not unlisted, f"docs/benchmarks.md does not mention: {unlisted}"


def test_every_result_the_page_and_the_history_link_exists() -> None:
    missing = []
    for page, prefix in [(PAGE, "bench/"), *((h, "") for h in HISTORY)]:
        for name in re.findall(rf"\]\({prefix}([^)#\s/]+\.(?:json|txt|md))", page.read_text()):
            if not (RESULTS / name).exists():
                missing.append(f"{page.name}: {name}")
    assert not missing, f"links to missing results: {missing}"


def test_the_page_starts_with_the_current_figures() -> None:
    text = PAGE.read_text()
    sections = re.findall(r"^## (.+)$", text, re.M)
    assert sections[0] == "Current figures"
    table = text[text.index("## Current figures") :].split("\n## ")[0]
    header, _, *rows = [line for line in table.splitlines() if line.startswith("|")]
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns == [
        "benchmark", "figure", "target", "current", "verdict", "date (UTC)", "load average",
        "result",
    ]  # fmt: skip
    assert len(rows) >= 20
    for row in rows:
        cells = dict(zip(columns, (c.strip() for c in row.strip("|").split("|")), strict=True))
        assert re.match(r"\d{4}-\d{2}-\d{2}", cells["date (UTC)"]), row
        assert re.search(r"\d", cells["load average"]), row
        assert cells["verdict"] in {"met", "missed", "missed, under load", "\u2013"}, row
        assert cells["target"] and cells["current"], row
    # every bench with a target has its row
    assert {r.split("|")[1].strip() for r in rows} >= {
        "`bench.engine`", "`bench.api`", "`bench.web`", "`bench.cluster`", "`bench.sources`",
        "`bench.autoscale`",
    }  # fmt: skip
