"""Rendered answers kept per process, keyed by their ETag: an unchanged answer is re-served
without reading its rows again or re-rendering them.

The ETags of the conditional reads (`controlplane.api.conditional`) name the revision of
what they describe, so (ETag, absolute URL, media type) names one body: while the revision
stands, every reader gets the same bytes. A view asks `cached(request, etag)` once it knows
the ETag (after authentication and the role check, which run for every request), and hands
a fresh answer to `remember(request, response, etag)`, which keeps its bytes once rendered.
A change moves the revision, hence the ETag, so nothing is ever invalidated: entries of old
revisions are simply not asked for again and fall out, least recently used first, when the
process's entries pass `EPOCHAL_RESPONSE_CACHE_BYTES` (0 turns the cache off). Only the
JSON representation is kept (the browsable API's HTML carries the user and a CSRF token).
This is the idea of Flink's REST endpoint serving job details from a cached execution graph.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from django.conf import settings
from rest_framework.request import Request
from rest_framework.response import Response

_Key = tuple[str, str, str]


class ResponseCache:
    """A byte-bounded LRU of rendered bodies; safe to share between a process's threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[_Key, tuple[bytes, str]] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: _Key) -> tuple[bytes, str] | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry

    def put(self, key: _Key, body: bytes, content_type: str, limit: int) -> None:
        if len(body) > limit // 8:  # one answer may not push out most of the others
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= len(old[0])
            self._entries[key] = (body, content_type)
            self._bytes += len(body)
            while self._bytes > limit and self._entries:
                _, (dropped, _) = self._entries.popitem(last=False)
                self._bytes -= len(dropped)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)


RESPONSES = ResponseCache()


class CachedResponse(Response):
    """An answer whose body was rendered before: DRF's finalize step and Django's render
    run as for any response, but rendering returns the kept bytes."""

    def __init__(self, body: bytes, content_type: str, etag: str) -> None:
        super().__init__(status=200)
        self._kept_body = body
        self._kept_type = content_type
        self["ETag"] = etag
        self["Cache-Control"] = "private, no-cache"

    @property
    def rendered_content(self) -> bytes:
        self["Content-Type"] = self._kept_type
        return self._kept_body


def _key(request: Request, etag: str) -> _Key | None:
    limit = settings.EPOCHAL_RESPONSE_CACHE_BYTES
    renderer = getattr(request, "accepted_renderer", None)
    if limit <= 0 or getattr(renderer, "format", None) != "json":
        return None
    # The body's links are absolute (scheme and host of the request); an Accept parameter
    # such as `indent` changes the bytes.
    return etag, request.build_absolute_uri(), str(getattr(request, "accepted_media_type", ""))


def cached(request: Request, etag: str) -> Response | None:
    """The kept answer for this request at `etag`, or None when it must be built."""
    key = _key(request, etag)
    if key is None:
        return None
    entry = RESPONSES.get(key)
    if entry is None:
        request._epochal_response_key = key  # type: ignore[attr-defined]
        return None
    return CachedResponse(entry[0], entry[1], etag)


def remember(request: Request, response: Response, etag: str) -> Response:
    """Keep `response`'s bytes once rendered (a 200 built for the current `etag`)."""
    key: Any = getattr(request, "_epochal_response_key", None)
    if key is None or key[0] != etag or response.status_code != 200:
        return response
    limit = settings.EPOCHAL_RESPONSE_CACHE_BYTES

    def keep(rendered: Any) -> None:
        if rendered.status_code == 200:
            RESPONSES.put(key, bytes(rendered.content), str(rendered["Content-Type"]), limit)

    response.add_post_render_callback(keep)
    return response
