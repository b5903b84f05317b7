"""The dashboard's live parts follow changes instead of polling.

A live element asks for its fragment with the ETag of what it shows (``If-None-Match``) and
``?watch=S``: the server holds the request until the job or operation changes (woken by
`controlplane.changes`) and answers the new fragment, or 304 when nothing changed within S
seconds; `app.js` then asks again at once. Parts that also age with the clock (lag, stall
alarms) carry a time bucket in their ETag, so they are re-rendered at least every
`AGE_BUCKET_S` seconds even when nothing was recorded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence

from django.http import HttpRequest, HttpResponse

from controlplane.api.conditional import watching
from controlplane.changes.feed import wait_for_change

WATCH_S = 25
AGE_BUCKET_S = 30


def live_etag(kind: str, ident: object, revision: int, *, ages: bool = False) -> str:
    parts = [f"web-{kind}", str(ident), str(revision)]
    if ages:
        parts.append(str(int(time.time() // AGE_BUCKET_S)))
    return '"' + ".".join(parts) + '"'


def watch_headers(etag: str) -> str:
    """The `hx-headers` value a live element sends its ETag with."""
    return json.dumps({"If-None-Match": etag})


def still_unchanged(
    request: HttpRequest,
    key: str | Sequence[str],
    revision: int,
    *,
    read: Callable[[], int] | None = None,
) -> bool:
    """For a client holding the current fragment: whether it is still current after watching
    `key` (the request's ``?watch=``, bounded by the process's watch slots); False means
    it changed meanwhile — read it again. `read`: how to compute the revision when `key`
    names several keys or a kind of them (`wait_for_change`)."""
    with watching(request) as deadline:  # type: ignore[arg-type]
        if deadline is None:
            return True
        changed = wait_for_change(
            key, revision, deadline=deadline, release_connection=True, read=read
        )
        return changed is None


def not_modified(etag: str) -> HttpResponse:
    response = HttpResponse(status=304)
    response["ETag"] = etag
    response["Cache-Control"] = "private, no-cache"
    return response
