"""Conditional reads: strong ETags from revisions (`controlplane.changes`), 304 when unchanged.

An ETag names the resource's revision — the id of its newest recorded change — and the
representation (`json`, `api`), never a hash of the body: checking one costs an index probe
and no rendering. ``If-None-Match`` with the current ETag (or ``*``) answers 304 with no body.
With ``?watch=S`` a matching request waits up to S seconds for a change (woken by
`controlplane.changes.feed`) and answers 200 with the new state, or 304 when none came.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from django.conf import settings
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.api.response_cache import cached, remember
from controlplane.changes.feed import wait_for_change
from controlplane.errors import InvalidRequest


def etag_for(request: Request, kind: str, *parts: object) -> str:
    renderer = getattr(request, "accepted_renderer", None)
    form = getattr(renderer, "format", "json")
    return '"' + ".".join([kind, *(str(p) for p in parts), form]) + '"'


def matches(request: Request, etag: str) -> bool:
    """Whether the client holds `etag` (``If-None-Match``); also checks ``?watch=``."""
    watch_seconds(request)
    header = request.headers.get("If-None-Match", "")
    if not header:
        return False
    if header.strip() == "*":
        return True
    return etag in (tag.strip().removeprefix("W/") for tag in header.split(","))


def not_modified(etag: str) -> Response:
    return tag(Response(status=304), etag)


def tag(response: Response, etag: str) -> Response:
    """Set `etag`; clients and caches revalidate before reusing the answer."""
    response["ETag"] = etag
    response["Cache-Control"] = "private, no-cache"
    return response


# -- watches: a conditional read that waits for the change -------------------------------------

_SLOTS: list[threading.BoundedSemaphore] = []
_SLOTS_LOCK = threading.Lock()


def _slots() -> threading.BoundedSemaphore:
    with _SLOTS_LOCK:
        if not _SLOTS:
            _SLOTS.append(threading.BoundedSemaphore(max(0, settings.EPOCHAL_WATCH_SLOTS) or 1))
        return _SLOTS[0]


def watch_seconds(request: Request) -> float:
    """``?watch=S``: hold a conditional read up to S seconds (1..`EPOCHAL_WATCH_MAX_S`)
    waiting for the resource to change; 0 (the default) answers at once."""
    raw = request.GET.get("watch")
    if raw is None or raw == "":
        return 0.0
    limit = settings.EPOCHAL_WATCH_MAX_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= limit:
        raise InvalidRequest(
            f"watch must be a number of seconds from 0 to {limit:g}, not {raw!r}",
            fields={"watch": [f"seconds, 0..{limit:g}"]},
        )
    return value


@contextmanager
def watching(request: Request) -> Iterator[float | None]:
    """The `time.monotonic()` deadline of this request's watch, or None when it asked for
    none or every watch slot of this process is taken (`EPOCHAL_WATCH_SLOTS`: a waiting
    watch holds a server thread, so at most that many wait; the rest answer at once with
    ``Epochal-Watch: busy`` and the client asks again)."""
    seconds = watch_seconds(request)
    if seconds <= 0 or settings.EPOCHAL_WATCH_SLOTS <= 0:
        yield None
        return
    slots = _slots()
    if not slots.acquire(blocking=False):
        request._epochal_watch_busy = True  # type: ignore[attr-defined]
        yield None
        return
    try:
        yield time.monotonic() + seconds
    finally:
        slots.release()


def not_modified_after_watch(request: Request, etag: str) -> Response:
    response = not_modified(etag)
    if getattr(request, "_epochal_watch_busy", False):
        response["Epochal-Watch"] = "busy"
        response["Retry-After"] = "1"
    return response


# -- the one conditional read ----------------------------------------------------------------

T = TypeVar("T")


def conditional_read(
    request: Request,
    *,
    key: str,
    seen: int,
    first: tuple[T, str],
    look: Callable[[], tuple[T, str]],
    build: Callable[[T], Response],
) -> Response:
    """A read with ETag, ``If-None-Match``, ``?watch=`` and the response cache, for a resource
    whose changes are recorded under change key `key` (last seen at revision `seen`).

    `first` is what the answer depends on and its ETag as read already; `look()` reads them
    again after a change; `build(state)` renders the body (an ETag is never newer than the
    body built after it). A matching ETag answers 304 — after waiting
    for a change when the request watches, looking again after each change of `key` until
    the ETag moves or the watch ends. A fresh answer is kept in the response cache."""
    state, etag = first
    if matches(request, etag):
        with watching(request) as deadline:
            while deadline is not None and matches(request, etag):
                now = wait_for_change(key, seen, deadline=deadline, release_connection=True)
                if now is None:
                    break
                seen = now
                state, etag = look()
        if matches(request, etag):
            return not_modified_after_watch(request, etag)
    kept = cached(request, etag)
    if kept is not None:
        return kept
    return remember(request, tag(build(state), etag), etag)
