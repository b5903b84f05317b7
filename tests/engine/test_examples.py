"""The example jobs run end to end and produce what their docstrings promise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest

from runners.engine import EpochRunner, read_dead_letters, read_output
from runners.jobs import clickstream, fraud, pageviews
from snapshots_store import Repository

pytestmark = pytest.mark.spark


def test_clickstream_sessions_close_after_a_gap(spark: Any, tmp_path: Path) -> None:
    data = str(tmp_path / "clicks")
    clickstream.generate(data, files=4, clicks=400, users=40)
    repo = Repository.open(f"file://{tmp_path}/store", "clicks")
    results = EpochRunner(spark, clickstream.job(data), repo=repo, parallelism=2).run()
    assert [r.records_in for r in results] == [400] * 4
    rows = read_output(repo, "main").to_pylist()
    assert rows, "some sessions closed"
    for row in rows:
        assert row["session_end"] >= row["session_start"] and row["clicks"] >= 1
        assert 1 <= row["distinct_pages"] <= len(clickstream.PAGES)


def test_fraud_velocity_alerts_bursting_cards(spark: Any, tmp_path: Path) -> None:
    data = str(tmp_path / "tx")
    fraud.generate(data, files=3, transactions=1500, cards=300)
    repo = Repository.open(f"file://{tmp_path}/store", "fraud")
    EpochRunner(spark, fraud.job(data), repo=repo, parallelism=3).run()
    alerts = read_output(repo, "main").to_pylist()
    assert alerts
    assert {a["card"] for a in alerts} <= {f"card-{i:05d}" for i in range(300)}
    assert all(a["count_10m"] > fraud.MAX_COUNT or a["amount_10m_cents"] > 200_000 for a in alerts)
    assert any(a["card"] < "card-00005" for a in alerts)  # the bursting cards


def test_pageviews_emit_final_sliding_windows_and_late_views(spark: Any, tmp_path: Path) -> None:
    from tests.engine.windows_data import reference

    data = tmp_path / "views"
    pageviews.generate(str(data), files=4, views=800)
    repo = Repository.open(f"file://{tmp_path}/store", "views")
    EpochRunner(spark, pageviews.job(str(data)), repo=repo, parallelism=2).run()
    got = read_output(repo, "main").to_pandas().rename(columns={"page": "key"})
    frames = [
        pq.read_table(path).to_pandas().rename(columns={"page": "key", "dwell_ms": "value"})
        for path in sorted(data.iterdir())
    ]
    expected, late = reference(frames, pageviews.WINDOW_MS, pageviews.SLIDE_MS, pageviews.DELAY_MS)
    columns = ["_epoch", "key", "window_start", "window_end", "count"]
    order = ["_epoch", "key", "window_start"]
    got = got.rename(columns={"sum_dwell_ms": "sum_value"}).sort_values(order)
    pd.testing.assert_frame_equal(
        got[[*columns, "sum_value"]].reset_index(drop=True),
        expected[[*columns, "sum_value"]].reset_index(drop=True),
        check_dtype=False,
    )
    assert sum(late) > 0 and len(read_dead_letters(repo, "main")) == sum(late)
