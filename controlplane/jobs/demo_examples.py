"""The example jobs `manage.py demo --job NAME` runs: where each one's input goes, how it is
generated and counted, and what its epochs print.

``clickstream`` (the default) is the session-statistics job over JSON-lines clicks
(runners/jobs/clickstream.py). ``pageviews`` is the event-time example
(runners/jobs/pageviews.py): views per page in 5-minute windows sliding by 1 minute, watermark
delay 30 s. Its view files each hold 2 minutes of event time, starting where the first run of
the demo put them (the current minute less the first batches' span, kept under var/), and a file
is added once its 2 minutes have passed on the wall clock: the watermark trails the wall clock
by a few minutes, as a live feed's would, and the windows close one by one as it advances.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq


@dataclass(frozen=True)
class Example:
    """One example job of the demo."""

    entry_point: str
    application: str
    job: str
    #: what one output row of an epoch is, as the demo's epoch lines say
    rows_out: str
    #: the input files' glob in the input directory
    pattern: str
    #: a one-line description for --help
    about: str

    def input_dir(self, var_dir: Path) -> Path:
        return var_dir / "demo" / f"{self.application}-input"

    def files(self, directory: Path) -> int:
        return len(list(directory.glob(self.pattern))) if directory.is_dir() else 0

    def input_records(self, directory: Path) -> int:
        """Records in the input files (what the job has to consume)."""
        if self.entry_point == "pageviews":
            return sum(pq.ParquetFile(p).metadata.num_rows for p in directory.glob(self.pattern))
        return sum(sum(1 for _ in p.open("rb")) for p in directory.glob(self.pattern))


CLICKSTREAM = Example(
    "clickstream",
    "clickstream",
    "clickstream-main",
    "sessions",
    "clicks-*",
    "sessions per user over JSON-lines clicks (files, a RabbitMQ stream or a Kafka topic)",
)
PAGEVIEWS = Example(
    "pageviews",
    "pageviews",
    "pageviews-main",
    "windows",
    "views-*",
    "views per page in 5-minute event-time windows sliding by 1 minute (Parquet files)",
)
EXAMPLES = {e.entry_point: e for e in (CLICKSTREAM, PAGEVIEWS)}


def pageviews_start_ms(var_dir: Path, batches: int) -> int:
    """Where the demo's view files start in event time: on the first run the current minute
    less `batches` files' span (so that many files are due at once), kept in
    ``var/demo/pageviews-start-ms`` for every later run."""
    from runners.jobs.pageviews import FILE_MS

    path = var_dir / "demo" / "pageviews-start-ms"
    if path.exists():
        return int(path.read_text().strip())
    now_ms = int(time.time() * 1000)
    start = now_ms - now_ms % 60_000 - batches * FILE_MS
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{start}\n")
    return start


def pageviews_due(start_ms: int, existing: int, batches: int) -> int:
    """View files to have: those whose 2 minutes of event time have passed on the wall clock,
    at most `batches` more than there are (a demo back after a long pause catches up a few
    batches at a time)."""
    from runners.jobs.pageviews import FILE_MS

    due = (int(time.time() * 1000) - start_ms) // FILE_MS
    return max(existing, min(due, existing + batches))


def generate_pageviews(directory: Path, var_dir: Path, *, batches: int, views: int) -> None:
    """Write the view files due now (existing ones are rewritten equal)."""
    from runners.jobs import pageviews

    start = pageviews_start_ms(var_dir, batches)
    files = pageviews_due(start, PAGEVIEWS.files(directory), batches)
    pageviews.generate(str(directory), files=files, views=views, start_ms=start)


def epoch_event_time(stats: dict[str, Any], extra: dict[str, Any]) -> str:
    """An event-time epoch's watermark and late records, for its line ("" for other jobs)."""
    doc = extra.get("event_time")
    if not isinstance(doc, dict):
        return ""
    watermark = doc.get("watermark")
    if watermark is None:
        shown = "none yet"
    else:
        shown = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(int(watermark) / 1000))
    return f"  watermark {shown}  {int(stats.get('late_records', 0)):>3} late"
