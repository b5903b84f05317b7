"""What the destination tests share: the job with sinks named by the environment, the contents
of each destination per epoch, a TCP proxy a test cuts, and a Redis server of a test's own."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from runners.engine import Job
from runners.engine.destinations import build
from tests.engine.jobs import stream_job

#: JSON list of {"name", "kind", "config"}: the sinks of `destinations_job`, in commit order
DESTINATIONS_ENV = "EPOCHAL_TEST_DESTINATIONS"
JOB = "destination-sink-job"


def destinations_job() -> Job:
    """`stream_job` (bounded epochs of a log source) whose output also goes to the sinks
    named by $EPOCHAL_TEST_DESTINATIONS."""
    specs = json.loads(os.environ[DESTINATIONS_ENV])
    sinks = [build(s["name"], s["kind"], s["config"]) for s in specs]
    return dataclasses.replace(stream_job(), sinks=sinks)


def _row_text(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True)


def contents(sink: Any) -> dict[int, list[str]]:
    """A destination's rows per epoch, each as sorted JSON text (the form of
    `output_by_epoch`), every record the destination holds counted."""
    return {e: sorted(json.dumps(r, sort_keys=True) for r in rows)
            for e, rows in sink.published().items()}  # fmt: skip


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class TcpProxy:
    """Forwards 127.0.0.1:`port` to `target`; `cut` refuses and drops every connection (the
    destination is unreachable), `restore` accepts again on the same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target, self.port = target, free_port()
        self._server: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        #: connections forwarded so far
        self.accepted = 0
        self.restore()

    def restore(self) -> None:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(64)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
                self.accepted += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def cut(self) -> None:
        if self._server is not None:
            # shutdown wakes the thread blocked in accept (close alone leaves it listening)
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
            self._server = None
        with self._lock:
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self._open.clear()

    def close(self) -> None:
        self.cut()


class PrivateRedis:
    """A redis-server of the test's own (append-only file in `home`), stopped and started on
    the same port and data."""

    def __init__(self, home: Path) -> None:
        self.home, self.port = home, free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None, "redis-server is not installed (apt-get install redis-server)"
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.home),
             "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 0.2),
            ):
                return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(20)
        self.process = None
