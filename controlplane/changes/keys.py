"""The keys changes are recorded under (the triggers build the same strings in SQL)."""

from __future__ import annotations

import uuid

CHANNEL = "epochal_changes"


def job_key(job_id: int) -> str:
    return f"job:{job_id}"


def operation_key(operation_id: uuid.UUID | str) -> str:
    return f"operation:{uuid.UUID(str(operation_id)).hex}"


def lineage_key(application_id: int) -> str:
    return f"lineage:{application_id}"
