"""A store that stays unavailable past its retry budget stops the job with a reason, not a
traceback: on the driver the error is a `StoreUnavailableError`; raised in an executor's task it
reaches the driver inside Spark's own exception, whose text carries it."""

from __future__ import annotations

import re

from snapshots_store import StoreUnavailableError

_IN_TASK = re.compile(r"StoreUnavailableError: (store \S+ unavailable: [^\n]*)")


def store_unavailable_reason(exc: BaseException) -> str | None:
    """The stop reason when `exc` is (or wraps) a store outage; None for any other error."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, StoreUnavailableError):
            return str(current)
        found = _IN_TASK.search(str(current))
        if found:
            return found.group(1)
        current = current.__cause__ or current.__context__
    return None
