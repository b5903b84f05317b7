"""Reading request bodies without letting slow clients hold the server's threads.

The web server (granian) hands the application a body it reads from the client on demand:
``wsgi.input.read(n)`` blocks one of the worker's Python threads until `n` bytes came or the
client closed. A client that sends the headers of a body and then trickles it (or nothing)
would hold that thread for as long as it keeps the connection open, and a few dozen such
clients would hold every thread — `/healthz` included.

So every body is read here, before anything else looks at it, and:

* a body over the limit is never read: 413, and the server closes the connection
  (``controlplane.api.middleware``);
* at most `EPOCHAL_BODY_SLOTS` threads of a process read bodies at once; a request that finds
  none free is answered at once, 503 with ``Retry-After: 1``, its body unread. The threads
  left serve everything without a body — `/healthz`, every read, every watch;
* a body not complete after `EPOCHAL_BODY_TIMEOUT_S` is refused with 408 (checked between
  chunks of `CHUNK` bytes: a client trickling a byte at a time still holds its slot until a
  chunk fills or it closes — the slot, never a thread beyond the slots).

Headers are the web server's business: it reads them in Rust, on no Python thread, and drops a
connection whose headers take longer than its ``--http1-header-read-timeout``.
"""

from __future__ import annotations

import io
import threading
import time
from typing import Any, Final

from django.conf import settings
from django.http import HttpRequest, JsonResponse

from controlplane.api.errors import error_body

CHUNK: Final = 16 * 1024

_slots: threading.BoundedSemaphore | None = None
_slots_size = 0
_slots_lock = threading.Lock()


def _body_slots() -> threading.BoundedSemaphore:
    """This process's body-reading slots (`EPOCHAL_BODY_SLOTS`; made again if it changes)."""
    global _slots, _slots_size
    size = max(1, int(settings.EPOCHAL_BODY_SLOTS))
    with _slots_lock:
        if _slots is None or _slots_size != size:
            _slots, _slots_size = threading.BoundedSemaphore(size), size
        return _slots


def busy() -> JsonResponse:
    response = JsonResponse(
        error_body(
            "busy",
            "every thread that reads request bodies is taken; retry in a second",
            detail={"retry_after_s": 1},
        ),
        status=503,
    )
    response["Retry-After"] = "1"
    return response


def _too_slow(timeout_s: float, got: int, length: int) -> JsonResponse:
    return JsonResponse(
        error_body(
            "body_timeout",
            f"the body did not arrive within {timeout_s:g} s ({got} of {length} bytes)",
            fields={"body": [f"not complete within {timeout_s:g} s"]},
            detail={"timeout_s": timeout_s, "received_bytes": got, "length_bytes": length},
        ),
        status=408,
    )


def _short(got: int, length: int) -> JsonResponse:
    return JsonResponse(
        error_body(
            "malformed_request",
            f"the body ended after {got} of the {length} bytes Content-Length announced",
            fields={"body": [f"{got} of {length} bytes"]},
        ),
        status=400,
    )


def read_body(request: HttpRequest, length: int) -> JsonResponse | None:
    """Read `request`'s body of `length` bytes (at most the body limit) into memory, in a
    slot and within the deadline, and give it to the request; the refusal when not."""
    stream: Any = request.META.get("wsgi.input")
    if stream is None or length <= 0:
        return None
    slots = _body_slots()
    if not slots.acquire(blocking=False):
        return busy()
    try:
        timeout_s = float(settings.EPOCHAL_BODY_TIMEOUT_S)
        deadline = time.monotonic() + timeout_s
        parts: list[bytes] = []
        got = 0
        while got < length:
            if time.monotonic() > deadline:
                return _too_slow(timeout_s, got, length)
            chunk = stream.read(min(CHUNK, length - got))
            if not chunk:
                return _short(got, length)
            parts.append(chunk)
            got += len(chunk)
    finally:
        slots.release()
    body = b"".join(parts)
    # Django reads the body from `_stream` (request.body, request.POST, DRF's parsers).
    request._stream = io.BytesIO(body)  # type: ignore[attr-defined]
    return None
