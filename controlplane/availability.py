"""A dependency that is away — the database, the object store — is an outage to wait out, not a
server bug: requests that need it answer 503 with ``Retry-After`` (never 500), and the probes
tell liveness (the process answers) from readiness (its dependencies answer too).

`unavailable(exc)` names the dependency an exception says is away; the API's exception handler
and the pages' 500 handler ask it first.
"""

from __future__ import annotations

import logging

from django.db import InterfaceError, OperationalError, connection

from snapshots_store import StoreUnavailableError

log = logging.getLogger(__name__)

#: Seconds a client should wait before retrying (a restart or failover takes about this).
RETRY_AFTER_S = 5


def unavailable(exc: BaseException | None) -> str | None:
    """ "database" or "store" when `exc` says that dependency is unreachable; None otherwise."""
    if isinstance(exc, StoreUnavailableError):
        return "store"
    if isinstance(exc, OperationalError | InterfaceError):
        return "database"
    return None


def message(dependency: str) -> str:
    return (
        f"the {dependency} is unavailable right now; nothing was changed by this request. "
        f"Retry in {RETRY_AFTER_S} s"
    )


def database_ready() -> str | None:
    """None when the database answers a query; else why not (the connection is dropped so the
    next request reconnects)."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except (OperationalError, InterfaceError) as exc:
        log.warning("readiness: the database does not answer: %s", exc)
        connection.close_if_unusable_or_obsolete()
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None
