"""Slow clients against the web server as deployed: does `/healthz` keep answering?

`python -m bench.slow_clients` serves the control plane with the Helm chart's web command
(granian, one worker of the chart's 32 threads with its 24 watch slots and 4 body slots, on a
scratch SQLite database with an operator and a token), then opens `--connections` connections
(200) for `--seconds` (60) that each do what a slow client does, in four equal parts:

* ``headers``: a request whose headers trickle in, a byte every half second, never ending;
* ``oversized``: `POST /api/jobs/` without credentials announcing a 2 MB body (over the
  limit), then a byte a second;
* ``anonymous_body``: `POST /login/` announcing a 4 KiB body (under the limit), a byte a second;
* ``authenticated_body``: `POST /api/jobs/` with the operator's token, a 4 KiB body at a byte a
  second.

Each connection starts again a second after the server answered or closed it (a slow client,
not a flood of requests: that is what the throttles are for). Meanwhile one client
asks `GET /healthz` on a new connection every 50 ms. It prints one JSON line: `/healthz` p50,
p99 and max during the attack, how many attack requests the server answered by status, the
most requests it held at once (complete headers, no answer for over a second: each holds one
of the server's Python threads) and the load average before and after.

The tests run the same attack, smaller and shorter (`tests/security/test_slow_clients.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.api import ROOT, free_port, server_command
from bench.timing import percentile

KINDS = ("headers", "oversized", "anonymous_body", "authenticated_body")
BODY_BYTES = 4096
OVERSIZED_BYTES = 2_000_000
HELD_AFTER_S = 1.0


def _head(kind: str, host: str, token: str) -> tuple[bytes, bytes]:
    """(sent at once, then trickled a byte at a time) for one request of `kind`."""
    if kind == "headers":
        return (f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n".encode(), b"X-Slow: " + b"a" * 100_000)
    if kind == "oversized":
        head = (
            f"POST /api/jobs/ HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {OVERSIZED_BYTES}\r\n\r\n"
        )
        return head.encode() + b"{", b" " * (OVERSIZED_BYTES - 1)
    if kind == "anonymous_body":
        head = (
            f"POST /login/ HTTP/1.1\r\nHost: {host}\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\n"
            f"Content-Length: {BODY_BYTES}\r\n\r\n"
        )
        return head.encode() + b"u", b"x" * (BODY_BYTES - 1)
    head = (
        f"POST /api/jobs/ HTTP/1.1\r\nHost: {host}\r\nAuthorization: Token {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {BODY_BYTES}\r\n\r\n"
    )
    return head.encode() + b"{", b" " * (BODY_BYTES - 1)


@dataclass
class Attack:
    host: str
    port: int
    token: str
    interval_s: float = 1.0
    stop: threading.Event = field(default_factory=threading.Event)
    answered: Counter[str] = field(default_factory=Counter)
    waiting_since: dict[int, float] = field(default_factory=dict)  # headers complete, no answer
    lock: threading.Lock = field(default_factory=threading.Lock)

    def held(self) -> int:
        """Attack requests the server holds now: headers complete, unanswered for a second."""
        now = time.monotonic()
        with self.lock:
            return sum(1 for since in self.waiting_since.values() if now - since > HELD_AFTER_S)

    def client(self, index: int, kind: str) -> None:
        sent_at_once, trickle = _head(kind, f"{self.host}:{self.port}", self.token)
        interval = self.interval_s / 2 if kind == "headers" else self.interval_s
        while not self.stop.is_set():
            try:
                with socket.create_connection((self.host, self.port), timeout=10) as conn:
                    conn.sendall(sent_at_once)
                    if kind != "headers":
                        with self.lock:
                            self.waiting_since[index] = time.monotonic()
                    self._trickle(conn, kind, trickle, interval)
            except OSError:
                with self.lock:
                    self.answered["connection_error"] += 1
                time.sleep(0.1)
            finally:
                with self.lock:
                    self.waiting_since.pop(index, None)
            self.stop.wait(interval)  # a slow client, not a flood: the throttles handle those

    def _trickle(self, conn: socket.socket, kind: str, trickle: bytes, interval: float) -> None:
        position = 0
        while not self.stop.is_set():
            readable, _, _ = select.select([conn], [], [], interval)
            if readable:
                data = conn.recv(65536)
                status = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "closed"
                with self.lock:
                    self.answered[f"{kind}:{status}"] += 1
                return
            if position < len(trickle):
                conn.sendall(trickle[position : position + 1])
                position += 1


def healthz_ms(host: str, port: int) -> float:
    """One `GET /healthz` on a new connection, in milliseconds (inf when it fails)."""
    started = time.perf_counter()
    try:
        with socket.create_connection((host, port), timeout=5) as conn:
            conn.sendall(
                f"GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
            )
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
        if not data.startswith(b"HTTP/1.1 200"):
            return float("inf")
    except OSError:
        return float("inf")
    return (time.perf_counter() - started) * 1000


def run_attack(
    host: str, port: int, token: str, *, connections: int, seconds: float, interval_s: float = 1.0
) -> dict[str, Any]:
    """Attack for `seconds` with `connections` slow clients while probing /healthz."""
    attack = Attack(host, port, token, interval_s)
    threads = [
        threading.Thread(target=attack.client, args=(i, KINDS[i % len(KINDS)]), daemon=True)
        for i in range(connections)
    ]
    load_before = os.getloadavg()
    for thread in threads:
        thread.start()
    time.sleep(min(3.0, seconds / 4))  # every connection open, the slow bodies started
    samples: list[float] = []
    held_max = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        samples.append(healthz_ms(host, port))
        held_max = max(held_max, attack.held())
        time.sleep(0.05)
    held_at_end = attack.held()
    load_after = os.getloadavg()
    attack.stop.set()
    for thread in threads:
        thread.join(timeout=5)
    finite = [s for s in samples if s != float("inf")]
    return {
        "connections": connections,
        "seconds": seconds,
        "healthz_requests": len(samples),
        "healthz_failed": len(samples) - len(finite),
        "healthz_p50_ms": round(statistics.median(samples), 2),
        "healthz_p99_ms": round(percentile(samples, 99), 2),
        "healthz_max_ms": round(max(samples), 2),
        "threads_held_max": held_max,
        "threads_held_at_end": held_at_end,
        "attack_answers": dict(sorted(attack.answered.items())),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
        "cpus": os.cpu_count(),
    }


def _scratch_deployment(var_dir: Path) -> tuple[dict[str, str], str]:
    """(the server's environment, an operator's token) on a new migrated SQLite database."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "EPOCHAL_"))},
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "EPOCHAL_VAR_DIR": str(var_dir),
        "DATABASE_URL": f"sqlite:///{var_dir / 'db.sqlite3'}",
        "EPOCHAL_WATCH_SLOTS": "24",
        "LOG_LEVEL": "ERROR",
    }
    env.pop("CACHE_URL", None)
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--no-input"], cwd=ROOT, env=env, check=True,
                   capture_output=True)  # fmt: skip
    made = subprocess.run(
        [*manage, "shell", "-c",
         "from controlplane.accounts.services import user_create, user_token; "
         "print(user_token(user=user_create(username='ops', role='operator')))"],
        cwd=ROOT, env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return env, made.stdout.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--threads", type=int, default=32, help="granian blocking threads")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="epochal-slow-clients-") as scratch:
        env, token = _scratch_deployment(Path(scratch))
        port = free_port()
        log = open(Path(scratch) / "server.log", "w")  # noqa: SIM115
        server = subprocess.Popen(
            server_command("granian", port, workers=1, threads=args.threads),
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while healthz_ms("127.0.0.1", port) == float("inf"):
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"granian did not come up: {Path(log.name).read_text()}")
                time.sleep(0.3)
            result = run_attack(
                "127.0.0.1", port, token, connections=args.connections, seconds=args.seconds
            )
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
            log.close()
    result["server"] = {
        "server": "granian",
        "workers": 1,
        "threads": args.threads,
        "watch_slots": 24,
        "body_slots": 4,
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
