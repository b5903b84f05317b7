"""One leader among control-plane replicas, as Kubernetes controllers elect theirs.

Two Celery workers with two beat schedulers (started by mistake, or during a rolling update)
would run the reconciler and the autoscaler twice per tick. Each periodic task therefore runs
its body only in the process that holds the role's lease: a PostgreSQL session-level advisory
lock, taken with ``pg_try_advisory_lock`` on a connection of its own that the process keeps. The
server releases it when that connection ends — the leader exits, crashes or loses the database —
and the next replica to try takes it over. The leader also acts at most once per half interval,
so two beats sending it the same tick act once, and a new leader waits half an interval before
its first act (its predecessor may have acted just before it died).

On SQLite (a single-process development setup) every process leads.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import connection

log = logging.getLogger(__name__)
T = TypeVar("T")

_lock = threading.Lock()
_sessions: dict[str, Any] = {}  # role -> the psycopg connection holding its advisory lock
_last_acted: dict[str, float] = {}


def _key(role: str) -> int:
    """The advisory lock's 64-bit key for `role` (stable across processes and releases)."""
    return int.from_bytes(
        hashlib.sha256(f"epochal:{role}".encode()).digest()[:8], "big", signed=True
    )


def _session() -> Any:
    import psycopg

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    params.pop("pool", None)
    return psycopg.connect(**params, autocommit=True)


def holds(role: str) -> bool:
    """Whether this process leads `role` (takes the lease when it is free)."""
    if connection.vendor != "postgresql":
        return True
    with _lock:
        session = _sessions.get(role)
        if session is not None:
            try:
                session.execute("SELECT 1")
                return True  # the lock lives as long as the session does
            except Exception:
                log.warning("leadership: lost the session holding %s; electing again", role)
                _sessions.pop(role, None)
        try:
            session = _session()
            taken = session.execute("SELECT pg_try_advisory_lock(%s)", [_key(role)]).fetchone()
        except Exception as exc:
            log.warning("leadership: cannot elect a leader for %s: %s", role, exc)
            return False
        if taken and taken[0]:
            _sessions[role] = session
            # a new leader lets half an interval pass before it acts: the one it replaces may
            # have acted just before it died (the lease hand-over's grace period)
            _last_acted[role] = time.monotonic()
            log.info("leadership: this process now leads %s", role)
            return True
        session.close()
        return False


def lead(role: str, interval_s: float, act: Callable[[], T]) -> T | None:
    """`act()` when this process leads `role` and did not act in the last half interval;
    None otherwise (another replica leads, or this tick was already handled)."""
    if not holds(role):
        return None
    now = time.monotonic()
    with _lock:
        if now - _last_acted.get(role, float("-inf")) < interval_s / 2:
            return None
        _last_acted[role] = now
    return act()


def resign(role: str) -> None:
    """Give the lease up (a process shutting down cleanly)."""
    with _lock:
        session = _sessions.pop(role, None)
        _last_acted.pop(role, None)
    if session is not None:
        session.close()


def periodic(entry: str, act: Callable[[], T]) -> T | None:
    """`lead` for the beat schedule's `entry` (its role, at its interval)."""
    from django.conf import settings

    interval = float(settings.CELERY_BEAT_SCHEDULE[entry]["schedule"])
    return lead(entry, interval, act)
