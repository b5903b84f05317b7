"""Canonical JSON and timestamps: the one byte encoding the store hashes and compares."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

JSON = Any


def utc_now_iso() -> str:
    """The current time as the canonical timestamp string (microseconds, ``Z``)."""
    return format_timestamp(datetime.now(UTC))


def format_timestamp(moment: datetime) -> str:
    if moment.tzinfo is None:
        raise ValueError("timestamps must be timezone-aware")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_timestamp(value: str) -> datetime:
    """Parse an ISO-8601 UTC timestamp; ValueError when it is not one."""
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None or moment.utcoffset() != timedelta(0):
        raise ValueError("not in UTC")
    return moment.astimezone(UTC)


def canonical_json(value: JSON) -> bytes:
    """The one byte encoding of a JSON value the store hashes and compares."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")
