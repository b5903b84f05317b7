"""A per-process cache of authenticated API tokens, checked against their revisions.

Looking a token up costs a join of token, user and role through the ORM (most of a cheap
request's CPU). A token seen in the last `TTL_S` seconds is instead checked with one plain
statement: the newest change recorded for ``token:<id>`` and ``user:<id>``
(`controlplane.changes`: the database's triggers record a revocation, a new expiry, a
deactivated user or a role change in the same transaction). If either moved since the entry
was cached, the entry is dropped and the token looked up again — so a revocation committed by
any process is refused by every process on its next request, not after a TTL. An expiry is
checked against the clock on every request. Unknown tokens are never cached.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models.base import ModelState
from django.utils import timezone

from controlplane.changes.models import Change

TTL_S = 60.0
"""How long an entry is trusted at most (it is re-read from the token table afterwards)."""
MAX_ENTRIES = 1024

_CHANGE = Change._meta.db_table
_PROBE = (
    f"SELECT COALESCE(GREATEST((SELECT MAX(id) FROM {_CHANGE} WHERE key = %s), "
    f"(SELECT MAX(id) FROM {_CHANGE} WHERE key = %s)), 0)"
)
_PROBE_SQLITE = (
    f"SELECT MAX(COALESCE((SELECT MAX(id) FROM {_CHANGE} WHERE key = %s), 0), "
    f"COALESCE((SELECT MAX(id) FROM {_CHANGE} WHERE key = %s), 0))"
)


def credential_keys(token_id: int, user_id: int) -> tuple[str, str]:
    return f"token:{token_id}", f"user:{user_id}"


def credentials_revision(token_id: int, user_id: int) -> int:
    """The newest change of the token and of its user: one statement, two index probes."""
    sql = _PROBE_SQLITE if connection.vendor == "sqlite" else _PROBE
    with connection.cursor() as cursor:
        cursor.execute(sql, list(credential_keys(token_id, user_id)))
        row = cursor.fetchone()
    return int(row[0] or 0)


@dataclass
class Entry:
    user: Any
    token: Any
    revision: int
    expires_at: datetime | None
    cached_at: float


class TokenCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, Entry] = {}

    def get(self, digest: str) -> tuple[Any, Any] | None:
        """(user, token) for a cached, still valid token; None when it must be looked up."""
        with self._lock:
            entry = self._entries.get(digest)
        if entry is None:
            return None
        now = time.monotonic()
        expired = entry.expires_at is not None and entry.expires_at <= timezone.now()
        if expired or now - entry.cached_at > TTL_S:
            self.forget(digest)
            return None
        if credentials_revision(entry.token.pk, entry.user.pk) != entry.revision:
            self.forget(digest)
            return None
        # each request gets its own instances: a view may set attributes on request.user
        user = _clone(entry.user)
        token = _clone(entry.token)
        token._state.fields_cache["user"] = user
        return user, token

    def put(self, digest: str, user: Any, token: Any, revision: int) -> None:
        entry = Entry(user, token, revision, token.expires_at, time.monotonic())
        with self._lock:
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.clear()
            self._entries[digest] = entry

    def touched(self, digest: str, last_used_at: datetime) -> None:
        with self._lock:
            entry = self._entries.get(digest)
            if entry is not None:
                entry.token.last_used_at = last_used_at

    def forget(self, digest: str) -> None:
        with self._lock:
            self._entries.pop(digest, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


def _clone(instance: Any) -> Any:
    """A shallow copy of a model instance (its own attributes and field cache). `copy.copy`
    goes through pickling support: ~50 us an instance, a noticeable share of a 304."""
    clone = instance.__class__.__new__(instance.__class__)
    clone.__dict__ = instance.__dict__.copy()
    state = clone._state = ModelState()
    state.__dict__ = instance._state.__dict__.copy()
    state.fields_cache = dict(instance._state.fields_cache)
    return clone


TOKENS = TokenCache()
