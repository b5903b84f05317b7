"""Example job: page views per page in 5-minute windows sliding by 1 minute, by event time.

Views arrive out of order (up to 30 s, the watermark's delay) and a few much later (they go to
the dead letters with reason ``late``); each page's view count and total dwell time per window
are emitted once, when the watermark passes the window's end (append mode).

    python -m runners.jobs.pageviews --data var/demo/pageviews --store file://var/store
"""

from __future__ import annotations

import argparse

import numpy as np
import pyarrow as pa

from runners.engine import Job, sources
from runners.engine import aggregations as agg
from runners.engine.eventtime import EventTime, sliding
from runners.engine.sources import write_parquet_file

MINUTE_MS = 60_000
WINDOW_MS, SLIDE_MS, DELAY_MS = 5 * MINUTE_MS, MINUTE_MS, 30_000
PAGES = ("/", "/pricing", "/docs", "/blog", "/signup", "/login", "/about", "/careers")


START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
FILE_MS = 2 * MINUTE_MS  # event time each file covers


def generate(
    directory: str, *, files: int = 5, views: int = 5000, seed: int = 4, start_ms: int = START_MS
) -> None:
    """Deterministic view files of 2 minutes of event time each from `start_ms`, shuffled
    and up to 30 s early; 1% of the views are 10 minutes old (late). Existing files are
    rewritten equal."""
    rng = np.random.default_rng(seed)
    start = start_ms
    for f in range(files):
        ts = start + f * FILE_MS + rng.integers(0, FILE_MS, views)
        ts -= rng.integers(0, DELAY_MS, views)
        late = rng.random(views) < 0.01
        ts[late] -= 10 * MINUTE_MS
        table = pa.table(
            {
                "page": pa.array([PAGES[p] for p in rng.zipf(1.6, views) % len(PAGES)]),
                "dwell_ms": pa.array(rng.integers(200, 120_000, views)),
                "ts": pa.array(ts),
            }
        )
        write_parquet_file(directory, f"views-{f:05d}", table)


def job(directory: str) -> Job:
    """Views and total dwell time per page and window."""
    return Job(
        name="pageviews",
        source=sources.ParquetDirectory(directory, max_files_per_epoch=1),
        key="page",
        aggregate=[agg.count(), agg.sum("dwell_ms")],
        event_time=EventTime("ts", DELAY_MS),
        window=sliding(WINDOW_MS, SLIDE_MS),
        time_mode="logical",
    )


def main(argv: list[str] | None = None) -> None:
    from runners.jobs.run import run_example

    parser = argparse.ArgumentParser(prog="python -m runners.jobs.pageviews")
    run_example(parser, argv, generate=generate, make_job=job, namespace="pageviews")


if __name__ == "__main__":
    main()
