"""A fault-injecting HTTP proxy in front of the moto S3 server.

Every request goes through to moto unless the proxy picks it for a fault, at random (seeded)
with probability `rate`, among the kinds `kinds`:

* ``500``: an S3 ``InternalError`` answer, the request not forwarded;
* ``503``: ``SlowDown`` (S3's throttling answer), the request not forwarded;
* ``reset``: the connection aborted with an RST — before forwarding, or (half the time) after
  moto carried the request out: the client cannot tell whether a write happened;
* ``slow``: the answer held back `slow_s` seconds (past the client's read timeout), then sent.

`script(...)` queues faults for the next requests of a method, in order, before any random
one (``reset-before`` and ``reset-after`` pick the side of a reset). `injected` counts the faults
by kind; `requests` counts every request. `pause()` makes every request fail (503) until
`resume()`: an outage longer than any retry budget. `drop_headers` are not forwarded (a server
that ignores conditional writes drops ``If-Match`` and ``If-None-Match``).
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from urllib.parse import urlsplit

KINDS = ("500", "503", "reset", "slow")

_ERROR = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
    "<Message>{message}</Message><RequestId>fault-proxy</RequestId></Error>"
)


class FaultyS3Proxy(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        upstream: str,
        *,
        rate: float = 0.0,
        kinds: tuple[str, ...] = KINDS,
        slow_s: float = 3.0,
        seed: int = 0,
        methods: tuple[str, ...] = ("GET", "PUT", "HEAD", "DELETE", "POST"),
        drop_headers: tuple[str, ...] = (),
    ) -> None:
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {KINDS}")
        self.upstream = urlsplit(upstream)
        self.rate = rate
        self.kinds = kinds
        self.slow_s = slow_s
        self.methods = methods
        self.drop_headers = frozenset(("expect", *(h.lower() for h in drop_headers)))
        self.rng = random.Random(seed)
        self.injected: Counter[str] = Counter()
        self.requests = 0
        self.paused = False
        self._script: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def pick(self, method: str) -> str | None:
        """The fault for the next request (None: forward it untouched)."""
        with self._lock:
            self.requests += 1
            if self.paused:
                self.injected["503"] += 1
                return "503"
            queued = self._script.get(method)
            if queued:
                kind = queued.pop(0)
                self.injected[kind.removesuffix("-before").removesuffix("-after")] += 1
                return kind
            if method not in self.methods or self.rng.random() >= self.rate:
                return None
            kind = self.rng.choice(self.kinds)
            self.injected[kind] += 1
            return kind

    def script(self, method: str, *kinds: str) -> None:
        with self._lock:
            self._script.setdefault(method, []).extend(kinds)

    def coin(self) -> bool:
        with self._lock:
            return self.rng.random() < 0.5

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def start(self) -> FaultyS3Proxy:
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def handle_error(self, request: object, client_address: object) -> None:
        """Aborted connections are the point here, not errors worth a traceback."""


@contextlib.contextmanager
def faulty_s3(upstream: str, **options: object) -> Iterator[FaultyS3Proxy]:
    proxy = FaultyS3Proxy(upstream, **options).start()  # type: ignore[arg-type]
    try:
        yield proxy
    finally:
        proxy.stop()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: FaultyS3Proxy
    protocol_version = "HTTP/1.1"  # keep-alive, and "Expect: 100-continue" answered at once

    def _abort(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()

    def _error(self, status: int, code: str, message: str) -> None:
        body = _ERROR.format(code=code, message=message).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        fault = self.server.pick(self.command)
        if fault == "500":
            return self._error(500, "InternalError", "We encountered an internal error.")
        if fault == "503":
            return self._error(503, "SlowDown", "Please reduce your request rate.")
        if fault == "reset":
            fault = "reset-before" if self.server.coin() else "reset-after"
        if fault == "reset-before":
            return self._abort()  # before the request reached the store
        headers = {
            k: v for k, v in self.headers.items() if k.lower() not in self.server.drop_headers
        }
        upstream = http.client.HTTPConnection(
            self.server.upstream.hostname or "127.0.0.1", self.server.upstream.port, timeout=60
        )
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
        finally:
            upstream.close()
        if fault == "reset-after":
            return self._abort()  # after: the write happened, its answer is lost
        if fault == "slow":
            time.sleep(self.server.slow_s)
        self.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(key, value)
        upstream_length = response.getheader("Content-Length")
        head = self.command == "HEAD" and upstream_length is not None
        self.send_header("Content-Length", str(upstream_length) if head else str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            with contextlib.suppress(OSError):
                self.wfile.write(data)
        return None

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    def log_message(self, format: str, *args: object) -> None:
        pass
