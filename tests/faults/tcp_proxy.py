"""A TCP proxy a test controls, put between the product and a real service.

Modes: ``pass`` forwards bytes both ways; ``delay`` forwards them `delay_s` late; ``cut`` closes
every open connection and refuses new ones (a closed port: the server is gone); ``reset`` aborts
every open connection and each new one with a TCP RST (a crashed peer, a failover). A test flips
the mode at the moment it chooses and back to ``pass`` to end the outage.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from typing import Literal

Mode = Literal["pass", "delay", "cut", "reset"]


def _abort(sock: socket.socket) -> None:
    """Close `sock` with an RST instead of a FIN (SO_LINGER with a zero timeout).

    A pump thread blocked reading `sock` holds the kernel's socket open past `close()` (no RST
    goes out, and a peer waiting for an answer would wait for ever): shutting the reading side
    down first wakes it, and the RST leaves when its read returns."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()


class TcpProxy:
    """Listens on 127.0.0.1:`port` (a free one) and forwards to `upstream` (host, port)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.mode: Mode = "pass"
        self.delay_s = 0.0
        self.connections = 0  # accepted so far (tests prove the product went through us)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closing = False
        self.port = 0

    # -- control ---------------------------------------------------------------------------

    def start(self) -> TcpProxy:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self.port = int(listener.getsockname()[1])
        self._listener = listener
        self._closing = False
        self._thread = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._closing = True
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        self._drop(abort=False)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def passthrough(self) -> None:
        self.mode, self.delay_s = "pass", 0.0

    def delay(self, seconds: float) -> None:
        self.mode, self.delay_s = "delay", seconds

    def cut(self) -> None:
        """Close every connection and refuse new ones until `passthrough`."""
        self.mode = "cut"
        self._drop(abort=False)

    def reset(self) -> None:
        """Abort every connection with an RST, and each new one, until `passthrough`."""
        self.mode = "reset"
        self._drop(abort=True)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- forwarding ------------------------------------------------------------------------

    def _drop(self, *, abort: bool) -> None:
        with self._lock:
            victims, self._open = self._open, set()
        for sock in victims:
            if abort:
                _abort(sock)
            else:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def _accept(self) -> None:
        assert self._listener is not None
        listener = self._listener
        while not self._closing:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            self.connections += 1
            if self.mode == "cut":
                client.close()
                continue
            if self.mode == "reset":
                _abort(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                _abort(client)
                continue
            with self._lock:
                # cut or reset while we connected upstream: `_drop` did not see this pair
                doomed = self.mode in ("cut", "reset")
                if not doomed:
                    self._open.update((client, server))
            if doomed:
                _abort(client)
                server.close()
                continue
            ends = [2]  # pumps still running; the last one closes both sockets
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink, ends), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, ends: list[int]) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data or self.mode in ("cut", "reset"):
                    break
                if self.mode == "delay":
                    time.sleep(self.delay_s)
                sink.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
        with self._lock:
            ends[0] -= 1
            last = ends[0] == 0
            if last:
                self._open.discard(source)
                self._open.discard(sink)
        if last:
            source.close()
            sink.close()
