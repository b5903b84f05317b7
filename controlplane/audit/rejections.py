"""Anonymous rejections are counted, not written to the audit log one row each: anyone can send
requests without credentials, and a row per request would let them flood the log.

Counters live in the shared cache (`CACHE_URL`): a running total per kind (exported to
Prometheus as `epochal_rejections_total{kind}`) and a count per kind, client address and
minute (`recent_rejections`), kept for an hour. What is audited row by row is what names an
account: logins of existing users, refusals of known (revoked, expired) tokens, and everything
authenticated users are refused."""

from __future__ import annotations

import time
from typing import Any, Final

from django.core.cache import cache

from controlplane.proxies import client_address

UNAUTHENTICATED: Final = "unauthenticated"
"""A request without credentials, or with a token that matches none."""
LOGIN_UNKNOWN_USER: Final = "login_unknown_user"
"""A failed sign-in naming no existing user."""
LOGIN_LOCKED_OUT: Final = "login_locked_out"
"""A sign-in attempt while its username and address are locked out."""
KINDS: Final = (UNAUTHENTICATED, LOGIN_UNKNOWN_USER, LOGIN_LOCKED_OUT)

WINDOW_S: Final = 60
KEEP_S: Final = 3600


def _incr(key: str, timeout: int | None) -> int:
    try:
        return int(cache.incr(key))
    except ValueError:  # not there yet (or expired)
        if cache.add(key, 1, timeout=timeout):
            return 1
        return int(cache.incr(key))


def count_rejection(kind: str, request: Any) -> int:
    """Count one rejection of `kind` from `request`'s client; the client's count this minute."""
    if kind not in KINDS:
        raise ValueError(f"unknown rejection kind {kind!r}")
    window = int(time.time()) // WINDOW_S
    _incr(f"rejections:{kind}:total", None)
    return _incr(f"rejections:{kind}:{window}:{client_address(request)}", KEEP_S)


def rejection_totals() -> dict[str, int]:
    """Rejections per kind since the cache was last emptied."""
    found = cache.get_many([f"rejections:{kind}:total" for kind in KINDS])
    return {kind: int(found.get(f"rejections:{kind}:total", 0)) for kind in KINDS}


def recent_rejections(kind: str, address: str, minutes: int = 1) -> int:
    """Rejections of `kind` from `address` in the last `minutes` minutes (at most an hour)."""
    window = int(time.time()) // WINDOW_S
    keys = [f"rejections:{kind}:{window - n}:{address}" for n in range(min(minutes, 60))]
    return sum(int(v) for v in cache.get_many(keys).values())
