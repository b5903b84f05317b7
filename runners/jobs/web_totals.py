"""A second-stage job of a job web (docs/webs.md): per-user totals over the closed sessions the
clickstream example commits on its branch, read as a `BranchOutputSource`.

    epochal register totals --job web-totals \\
        --job-args '{"store": "file://var/store", "namespace": "clicks", "branch": "main"}'
"""

from __future__ import annotations

from runners.engine import Job
from runners.engine import aggregations as agg
from runners.engine.branch_source import BranchOutputSource

SESSIONS = {
    "user": "string",
    "session_start": "int64",
    "session_end": "int64",
    "clicks": "int64",
    "distinct_pages": "int64",
}


def job(store: str, namespace: str, branch: str = "main", code_version: str = "1") -> Job:
    source = BranchOutputSource(store, namespace, branch, schema=SESSIONS)
    return Job(
        name="session-totals",
        source=source,
        key="user",
        aggregate=[agg.count(), agg.sum("clicks"), agg.max("distinct_pages")],
        code_version=code_version,
        time_mode="logical",
    )
