"""Watermarks along a job web (docs/webs.md "Watermarks along the web"): a job reading
upstream branches never has a watermark past the one the newest upstream epoch it read
recorded; the manifest says which upstream held it back, and a replay (a fork re-reading the
same upstream epochs) records the same watermarks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from runners.engine import EpochRunner, Job, read_output
from runners.engine.branch_source import BranchOutputSource
from runners.engine.eventtime import EventTime, IntervalJoin
from runners.engine.eventtime.watermark import NO_WATERMARK, bounded
from runners.engine.fan_in import FanInSource
from runners.engine.sources import ParquetDirectory
from runners.engine.state_ops import new_branch_commit
from snapshots_store import Repository
from tests.engine.test_branch_source import echo
from tests.engine.windows_data import Layout, event_frames, write_event_files

pytestmark = pytest.mark.spark

LAYOUT = Layout(files=4, keys=20, records=200)
OWN_DELAY = 1_000  # the downstream's own delay: it would run ahead of its upstreams


def test_the_bound_is_the_lowest_upstream_and_an_upstream_without_a_watermark_holds() -> None:
    value, ups, held = bounded(9_000, {"a": {"watermark": 7_000, "epoch": 2}},
                               {"b": {"watermark": 8_000, "epoch": 1}})  # fmt: skip
    assert (value, held, sorted(ups)) == (7_000, "a", ["a", "b"])
    assert bounded(5_000, {"a": {"watermark": 7_000, "epoch": 2}}, {}) == (
        5_000, {"a": {"watermark": 7_000, "epoch": 2}}, None)  # fmt: skip
    assert bounded(5_000, {}, {"a": {"watermark": None, "epoch": 1}})[0::2] == (NO_WATERMARK, "a")


def _echo(name: str, source: Any, delay_ms: int) -> Job:
    return Job(name=name, source=source, key="key", process=echo, time_mode="logical",
               event_time=EventTime("ts", delay_ms))  # fmt: skip


def _docs(repo: Repository, branch: str = "main") -> list[dict[str, Any]]:
    chain = reversed(list(repo.log(f"heads/{branch}", first_parent=True)))
    return [m.extra["event_time"] for _, m in chain if m.kind in ("epoch", "rescale")]


def _max_ts(files: int) -> int:
    """The largest event time in the first `files` input files (computed from the data)."""
    return int(max(frame["ts"].max() for frame in event_frames(LAYOUT)[:files]))


@pytest.fixture(scope="module")
def upstreams(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two upstream echo jobs over the same files, one file per epoch: `fast` (delay 5 s) and
    `slow` (delay 8 s); returns the store URL."""
    root = tmp_path_factory.mktemp("web")
    data = str(root / "in")
    write_event_files(data, LAYOUT)
    store = f"file://{root}/store"
    for name, delay in (("fast", 5_000), ("slow", 8_000)):
        source = ParquetDirectory(data, max_files_per_epoch=1)
        EpochRunner(spark, _echo(name, source, delay), repo=Repository.open(store, name)).run()
    return store


def test_a_downstream_watermark_never_passes_its_upstreams_and_replays_the_same(
    spark: Any, upstreams: str, tmp_path: Path
) -> None:
    source = BranchOutputSource(upstreams, "fast", "main", max_epochs_per_epoch=1)
    down = Repository.open(upstreams, "down-one")
    EpochRunner(spark, _echo("down", source, OWN_DELAY), repo=down, parallelism=2).run()
    docs = _docs(down)
    assert len(docs) == LAYOUT.files
    for epoch, doc in enumerate(docs, start=1):  # epoch m read the fast job's epoch m
        assert doc["own"] == _max_ts(epoch) - OWN_DELAY  # what its own records allow
        assert doc["watermark"] == _max_ts(epoch) - 5_000  # the upstream's: held back
        assert doc["held_by"] == "upstream"
        assert doc["upstreams"] == {"upstream": {"watermark": doc["watermark"], "epoch": epoch}}
        assert doc["applied"] == (None if epoch == 1 else docs[epoch - 2]["watermark"])

    # a fork from epoch 2 re-reads upstream epochs 3 and 4: the same watermarks
    second = next(sid for sid, m in down.log("heads/main", first_parent=True) if m.epoch == 2)
    new_branch_commit(down, second, "replay", kind="fork", operation_id=None,
                      provenance={"reason": "replay"})  # fmt: skip
    EpochRunner(spark, _echo("down", source, OWN_DELAY), repo=down, branch="replay",
                parallelism=1).run()  # fmt: skip
    assert _docs(down, "replay") == docs


def test_a_fan_in_is_held_by_its_slowest_upstream_and_names_it(spark: Any, upstreams: str) -> None:
    source = FanInSource(
        [BranchOutputSource(upstreams, "fast", "main", name="fast"),
         BranchOutputSource(upstreams, "slow", "main", name="slow")]
    )  # fmt: skip
    down = Repository.open(upstreams, "down-fan-in")
    EpochRunner(spark, _echo("merged", source, OWN_DELAY), repo=down).run()
    (doc,) = _docs(down)  # both upstreams committed every epoch: one downstream epoch
    files = LAYOUT.files
    assert doc["own"] == _max_ts(files) - OWN_DELAY
    assert doc["watermark"] == _max_ts(files) - 8_000
    assert doc["held_by"] == "inputs/slow"
    assert doc["upstreams"] == {
        "inputs/fast": {"watermark": _max_ts(files) - 5_000, "epoch": files},
        "inputs/slow": {"watermark": _max_ts(files) - 8_000, "epoch": files},
    }


def test_an_interval_join_of_two_upstream_branches_is_held_by_the_slower(
    spark: Any, upstreams: str
) -> None:
    """The join's sides are the two upstream branches: its watermark is bounded by both, so
    the slow upstream (delay 8 s) holds it, and the rows it calls late are those below that
    bound; the pairs equal a pandas join of the rows that were not late."""
    join = IntervalJoin(
        left=BranchOutputSource(upstreams, "fast", "main", max_epochs_per_epoch=1),
        right=BranchOutputSource(upstreams, "slow", "main", max_epochs_per_epoch=1),
        on="key", left_time="ts", right_time="ts", lower_ms=500, upper_ms=500,
        delay_ms=OWN_DELAY,
    )  # fmt: skip
    down = Repository.open(upstreams, "down-join")
    EpochRunner(spark, Job(name="pairs", source=join, key="key"), repo=down).run()
    docs = _docs(down)
    frames = event_frames(LAYOUT)
    kept = []
    for epoch, doc in enumerate(docs[: LAYOUT.files], start=1):
        assert doc["held_by"] == "join/right"
        assert doc["watermark"] == _max_ts(epoch) - 8_000
        assert sorted(doc["upstreams"]) == ["join/left", "join/right"]
        bound = None if epoch == 1 else _max_ts(epoch - 1) - 8_000
        frame = frames[epoch - 1]
        kept.append(frame if bound is None else frame[frame["ts"] > bound])
    rows = pd.concat(kept)
    pairs = rows.merge(rows, on="key", suffixes=("_l", "_r"))
    pairs = pairs[(pairs["ts_l"] - 500 <= pairs["ts_r"]) & (pairs["ts_r"] <= pairs["ts_l"] + 500)]
    expected = sorted(
        zip(pairs["key"], pairs["ts_l"], pairs["value_l"], pairs["ts_r"], pairs["value_r"],
            strict=True)
    )  # fmt: skip
    out = read_output(down, "main").to_pandas()
    got = sorted(
        zip(out["key"], out["left_ts"], out["left_value"], out["right_ts"], out["right_value"],
            strict=True)
    )  # fmt: skip
    assert got == expected and len(expected) > 200
