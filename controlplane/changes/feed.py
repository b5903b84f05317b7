"""Waiting for a change without polling: `wait_for_change(key, seen, deadline=…)`.

On PostgreSQL each process keeps one listener thread on its own connection
(``LISTEN epochal_changes``) that wakes the waiters of the key a notification names; a
waiter then reads the key's revision once (one index probe) to confirm. Nothing runs while
nothing changes: an idle watch costs no CPU and, with `release_connection`, holds no
database connection either. Without a listener (SQLite, or while the listener reconnects)
waiters read the revision every `POLL_S` seconds instead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connection

from controlplane.changes.keys import CHANNEL
from controlplane.changes.selectors import revision

POLL_S = 0.5
RETRY_S = 1.0
STOP_CHECK_S = 30.0
"""The listener's longest sleep between looks at its stop flag; `stop` wakes it at once
with a notification (an idle server wakes for nothing: a wake-up a second per process was
a measurable share of what 50 idle watches cost)."""
logger = logging.getLogger(__name__)


class _Listener:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: defaultdict[str, set[threading.Event]] = defaultdict(set)
        self._thread: threading.Thread | None = None
        self._conninfo: dict[str, Any] = {}
        self._stopping = False
        self.listening = threading.Event()

    def register(self, key: str, event: threading.Event | None = None) -> threading.Event:
        event = event or threading.Event()
        with self._lock:
            self._waiters[key].add(event)
            if self._thread is None and connection.vendor == "postgresql":
                self._conninfo = _conninfo()
                self._thread = threading.Thread(
                    target=self._run, args=(self._conninfo,), name="epochal-changes", daemon=True
                )
                self._thread.start()
        return event

    def unregister(self, key: str, event: threading.Event) -> None:
        with self._lock:
            waiting = self._waiters.get(key)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del self._waiters[key]

    def _wake(self, key: str | None) -> None:
        with self._lock:
            if key is None:
                events = [e for waiting in self._waiters.values() for e in waiting]
            else:  # the key's own waiters and those of every key of its kind (`job:*`)
                events = [
                    *self._waiters.get(key, ()),
                    *self._waiters.get(key.partition(":")[0] + ":*", ()),
                ]
        for event in events:
            event.set()

    def _run(self, conninfo: dict[str, Any]) -> None:
        import psycopg

        while not self._stopping:
            try:
                with psycopg.connect(**conninfo, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.listening.set()
                    self._wake(None)  # whatever changed while nobody listened
                    while not self._stopping:  # `stop` sends a notification to end this
                        for note in conn.notifies(timeout=STOP_CHECK_S):
                            if self._stopping:
                                break
                            self._wake(note.payload)
            except Exception:  # the database went away: poll until it is back
                if not self._stopping:
                    logger.warning("change listener lost its connection; retrying", exc_info=True)
            self.listening.clear()
            self._wake(None)
            if not self._stopping:
                time.sleep(RETRY_S)

    def stop(self) -> None:
        """End the listener thread and close its connection (tests, before the database is
        dropped); the next `register` starts a new one."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stopping = True
        if thread is None:
            self._stopping = False
            return
        _knock(self._conninfo)
        thread.join(timeout=STOP_CHECK_S + RETRY_S)
        self._stopping = False


def _conninfo() -> dict[str, Any]:
    settings = connection.settings_dict
    info = {
        "dbname": settings["NAME"],
        "user": settings.get("USER") or None,
        "password": settings.get("PASSWORD") or None,
        "host": settings.get("HOST") or None,
        "port": settings.get("PORT") or None,
        "application_name": "epochal-changes",
    }
    return {k: v for k, v in info.items() if v is not None}


def _knock(conninfo: dict[str, Any]) -> None:
    """Wake the listeners (an empty key: no waiter is woken) so a stopping one ends now."""
    import psycopg

    try:
        with psycopg.connect(**conninfo, autocommit=True) as conn:
            conn.execute("SELECT pg_notify(%s, '')", [CHANNEL])
    except Exception:  # the database is gone: the listener ends after STOP_CHECK_S
        logger.warning("could not wake the change listener to stop it", exc_info=True)


_LISTENER = _Listener()


def stop_listening() -> None:
    _LISTENER.stop()


def wait_for_change(
    key: str | Sequence[str],
    seen: int,
    *,
    deadline: float,
    release_connection: bool = False,
    read: Callable[[], int] | None = None,
) -> int | None:
    """Block until the revision of `key` is no longer `seen`; the new revision, or None when
    `deadline` (a `time.monotonic()` instant) passes first. `release_connection` gives the
    thread's database connection back while waiting (a web request's watch).

    `key` may be several keys, and a key may name a whole kind (``job:*``: any job); then
    `read` computes the revision the waiter compares with `seen` (by default the revision
    of the one key)."""
    keys = [key] if isinstance(key, str) else list(key)
    current_of = read if read is not None else (lambda: revision(keys[0]))
    event = threading.Event()  # one event, woken by a change to any of the keys
    for k in keys:
        _LISTENER.register(k, event)
    try:
        while True:
            current = current_of()
            if current != seen:
                return current
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            if release_connection:
                connection.close()
            listening = _LISTENER.listening.is_set()
            woken = event.wait(remaining if listening else min(remaining, POLL_S))
            event.clear()
            # nothing was announced for the whole wait: unchanged, no need to ask (nor to
            # reconnect); a lost listener wakes every waiter, so this is never stale
            quiet = not woken and listening and _LISTENER.listening.is_set()
            if quiet and deadline - time.monotonic() <= 0:
                return None
    finally:
        for k in keys:
            _LISTENER.unregister(k, event)
