"""The benchmark's vectorised engine job: per ``key`` the running count, sum and max of
``value`` over a directory of epoch files (one file per epoch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def aggregate_job(name: str, directory: Path | str) -> Any:
    from runners.engine import Job, sources
    from runners.engine import aggregations as agg

    source = sources.ParquetDirectory(str(directory), max_files_per_epoch=1)
    return Job(
        name=name,
        source=source,
        key="key",
        aggregate=[agg.count(), agg.sum("value"), agg.max("value")],
        code_version="1",
    )
