"""REST API latency under load: `python -m bench.api [--snapshots 100000 --clients 50 …]`.

1. Creates a scratch database next to the one `DATABASE_URL` names (PostgreSQL:
   ``<name>_bench_api``, dropped afterwards; SQLite: a file in a temporary folder), migrates
   it, and bulk-loads a synthetic lineage of `--snapshots` snapshots over `--branches`
   branches with the lineage benchmark's builder (`bench.lineage.build_index`), plus an
   application version, a job on `main` and a viewer with an API token.
2. Serves the control plane on a free loopback port with `--server`: gunicorn (`gthread`
   workers) or granian (a Rust HTTP server; WSGI calls on a pool of Python threads).
3. Runs `--clients` concurrent clients for `--seconds` (coroutines on one asyncio loop, or a
   thread each with `--load-client threads`). Each client keeps one HTTP/1.1
   connection and sends `--rate` requests per second (paced, with jitter), cycling through
   the endpoints: the job (`GET /api/jobs/bench-job/`), a page of a random branch's log
   (`GET …/snapshots/?rev=heads/<b>&limit=50`, half first-parent), a random page of the
   lineage graph (`GET …/lineage/?limit=100&cursor=<id>`) and, as the baseline measured under
   the same load, `GET /healthz` (one `SELECT 1`, no auth, no serializer).

4. The server's CPU per request **per endpoint class**: a window per class (`--class-seconds`)
   in which every client asks only for that class, its CPU ÷ its requests, counting the
   PostgreSQL backends serving the scratch database (their process times from /proc: they run
   the statements and render the lineage and log pages' JSON) with the web server's
   processes; healthz apart, ``api`` the three API classes together.
5. Conditional reads, saturation steps and idle watchers (docs/benchmarks.md).

Every phase runs `--runs` times (default 3) against the same server and database. Progress
goes to stderr; the last stdout line is one JSON object: every figure as the median of the
runs, every run in ``runs`` with its load averages, and ``verdicts``: each target (CPU per
request ≤ 3 ms per API class and for the API mix, saturation ≥ 400 req/s, the API p99 ≤ twice
healthz's at 200 req/s, idle watchers ≤ 5 ms/s) judged on the median of the runs, every run's
value listed. Exit status 1 when any request of the main windows or the class windows failed.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench.timing import code_version, percentile

ROOT = Path(__file__).resolve().parent.parent
JOB = "bench-job"
ENDPOINTS = ("job", "snapshots", "lineage", "healthz")
API_ENDPOINTS = ENDPOINTS[:-1]


def log(message: str) -> None:
    print(f"[bench.api {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- the scratch database -------------------------------------------------------------------


@contextmanager
def scratch_database(url: str, keep: bool) -> Iterator[str]:
    """A fresh database beside the one `url` names; yields its URL."""
    parts = urlsplit(url)
    if parts.scheme.startswith("postgres"):
        import psycopg

        name = (parts.path.lstrip("/") or "postgres") + "_bench_api"
        admin = urlunsplit(parts._replace(scheme="postgresql", path="/postgres"))
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        try:
            yield urlunsplit(parts._replace(path=f"/{name}"))
        finally:
            if not keep:
                with psycopg.connect(admin, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        return
    with tempfile.TemporaryDirectory(prefix="bench-api-") as folder:
        yield f"sqlite:///{folder}/bench.sqlite3"


def prepare(*, snapshots: int, branches: int, seed: int) -> dict[str, Any]:
    """Migrate, load the lineage, create the job and a viewer; facts for the clients."""
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, connections

    from bench.lineage import build_index
    from controlplane.accounts.services import user_create, user_token
    from controlplane.applications.services import version_create
    from controlplane.jobs.services import job_create
    from controlplane.lineage.models import Snapshot

    call_command("migrate", verbosity=0)
    facts = build_index(snapshots=snapshots, branches=branches, seed=seed)
    application = facts["application"]
    version = version_create(application=application, job="clickstream")
    job_create(name=JOB, application=application, version=version, branch="main")
    token = user_token(user=user_create(username="bench-viewer", role="viewer"))
    ids = Snapshot.objects.filter(application=application).values_list("id", flat=True)
    low, high = min(ids), max(ids)
    vendor = connection.vendor
    connections.close_all()
    return {
        "application": application.name,
        "branches": facts["branch_names"],
        "snapshots": len(facts["snapshot_ids"]),
        "pk_range": (low, high),
        "token": token,
        "database": vendor,
        "build_s": facts["build_s"],
    }


# -- the server -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SERVERS = ("gunicorn", "granian")


def server_command(server: str, port: int, *, workers: int, threads: int) -> list[str]:
    """The command that serves `controlplane.wsgi` with `server`, shaped alike for both:
    `workers` processes, each running the application on up to `threads` Python threads (a
    waiting watch holds one)."""
    if server == "gunicorn":
        return [
            sys.executable,
            "-m",
            "gunicorn",
            "controlplane.wsgi:application",
            f"--bind=127.0.0.1:{port}",
            "--worker-class=gthread",
            f"--workers={workers}",
            f"--threads={threads}",
            "--keep-alive=30",
            "--backlog=2048",
            "--log-level=warning",
        ]
    if server == "granian":
        return [
            sys.executable,
            "-m",
            "granian",
            "--interface=wsgi",
            "controlplane.wsgi:application",
            "--host=127.0.0.1",
            f"--port={port}",
            f"--workers={workers}",
            f"--blocking-threads={threads}",
            # backpressure counts open connections (keep-alive ones too), not requests: it
            # must stay above every client's connection, so the threads limit the work
            "--backpressure=1024",
            "--backlog=2048",
            "--http1-header-read-timeout=10000",  # the chart's (slow clients)
            "--http=1",
            "--no-ws",
            "--log-level=warning",
        ]
    raise ValueError(f"unknown server {server!r}: one of {', '.join(SERVERS)}")


@contextmanager
def serve(
    database_url: str,
    *,
    server: str = "granian",
    workers: int,
    threads: int,
    watch_slots: int,
    db_pool: int = 0,
) -> Iterator[tuple[int, int]]:
    """Serve the control plane on a free loopback port with `server`; yields (port, the
    server's main process id: its CPU and its workers' are `server_cpu_s(pid)`)."""
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "EPOCHAL_WATCH_SLOTS": str(watch_slots),
        "EPOCHAL_DB_POOL_SIZE": str(db_pool),
        "DJANGO_DEBUG": "false",  # DEBUG keeps every query in memory
        "EPOCHAL_API_RATE": "1000000000/hour",
        "LOG_LEVEL": "WARNING",
    }
    command = server_command(server, port, workers=workers, threads=threads)
    # the server's output (granian logs to stdout) goes to stderr: stdout ends with the JSON
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=sys.stderr, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/healthz")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{server} did not come up on port {port}")
            time.sleep(0.2)
        log(
            f"{server} pid {process.pid} on 127.0.0.1:{port}: {workers} workers x {threads} "
            f"threads, database pool {db_pool or 'off'}"
        )
        yield port, process.pid
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


# -- the clients ----------------------------------------------------------------------------


@dataclass
class Samples:
    latencies: dict[str, list[float]] = field(default_factory=lambda: {e: [] for e in ENDPOINTS})
    errors: dict[str, int] = field(default_factory=lambda: {e: 0 for e in ENDPOINTS})
    error_examples: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, endpoint: str, ms: float, ok: bool, what: str) -> None:
        with self.lock:
            self.latencies[endpoint].append(ms)
            if not ok:
                self.errors[endpoint] += 1
                if len(self.error_examples) < 5:
                    self.error_examples.append(what)


def path_for(endpoint: str, facts: dict[str, Any], rng: random.Random) -> str:
    app = facts["application"]
    if endpoint == "job":
        return f"/api/jobs/{JOB}/"
    if endpoint == "snapshots":
        branch = rng.choice(facts["branches"])
        first_parent = "&first_parent=true" if rng.random() < 0.5 else ""
        return f"/api/applications/{app}/snapshots/?rev=heads/{branch}&limit=50{first_parent}"
    if endpoint == "lineage":
        low, high = facts["pk_range"]
        return f"/api/applications/{app}/lineage/?limit=100&cursor={rng.randint(low + 100, high)}"
    return "/healthz"


def client(
    index: int,
    port: int,
    facts: dict[str, Any],
    *,
    window: dict[str, float],
    interval: float,
    samples: Samples | None,
    start: threading.Barrier,
    endpoints: tuple[str, ...] = ENDPOINTS,
) -> None:
    rng = random.Random(index)
    headers = {"Authorization": f"Token {facts['token']}", "Accept": "application/json"}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    step = index % len(endpoints)
    start.wait()
    until = window["until"]
    next_at = time.monotonic() + rng.random() * interval  # spread the first requests
    while True:
        now = time.monotonic()
        if next_at > now:
            time.sleep(next_at - now)
        if time.monotonic() >= until:
            break
        endpoint = endpoints[step % len(endpoints)]
        step += 1
        path = path_for(endpoint, facts, rng)
        started = time.perf_counter()
        try:
            conn.request("GET", path, headers=headers if endpoint != "healthz" else {})
            response = conn.getresponse()
            body = response.read()
            ok = response.status == 200
            what = f"{response.status} {path}: {body[:200]!r}"
        except (OSError, http.client.HTTPException) as exc:
            ok, what = False, f"{type(exc).__name__} {path}: {exc}"
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        ms = (time.perf_counter() - started) * 1000
        if samples is not None:
            samples.add(endpoint, ms, ok, what)
        next_at += interval * rng.uniform(0.8, 1.2)
    conn.close()


def load(
    port: int,
    facts: dict[str, Any],
    *,
    clients: int,
    seconds: float,
    rate: float,
    record: bool,
    mode: str = "asyncio",
    endpoints: tuple[str, ...] = ENDPOINTS,
) -> Samples:
    """`clients` paced clients for `seconds`: one asyncio event loop multiplexing their
    connections (`mode="asyncio"`: the generator's own CPU stays small and no client waits
    for another's turn at the interpreter to read its answer), or one thread each
    (`mode="threads"`, the generator of the runs before 2026-11-27)."""
    if mode == "asyncio":
        return asyncio.run(
            _load_async(
                port,
                facts,
                clients=clients,
                seconds=seconds,
                rate=rate,
                record=record,
                endpoints=endpoints,
            )
        )
    samples = Samples()
    start = threading.Barrier(clients + 1)
    window: dict[str, float] = {}
    threads = [
        threading.Thread(
            target=client,
            args=(i, port, facts),
            kwargs={
                "window": window,
                "interval": 1.0 / rate,
                "samples": samples if record else None,
                "start": start,
                "endpoints": endpoints,
            },
            daemon=True,
        )
        for i in range(clients)
    ]
    for thread in threads:
        thread.start()
    window["until"] = time.monotonic() + seconds  # before the barrier releases the clients
    start.wait()
    for thread in threads:
        thread.join(timeout=seconds + 120)
    return samples


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> tuple[int, bytes]:
    """Send one HTTP/1.1 request on a kept-alive connection; (status, body)."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        return status, await reader.readexactly(int(headers["content-length"]))
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                return status, bytes(body)
            body += chunk[:-2]
    return status, b""  # 304, 204: no body


async def _client_async(
    index: int,
    port: int,
    facts: dict[str, Any],
    *,
    until: float,
    interval: float,
    samples: Samples | None,
    endpoints: tuple[str, ...] = ENDPOINTS,
) -> None:
    rng = random.Random(index)
    auth = f"Authorization: Token {facts['token']}\r\nAccept: application/json\r\n"
    step = index % len(endpoints)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    next_at = time.monotonic() + rng.random() * interval  # spread the first requests
    try:
        while True:
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if time.monotonic() >= until:
                break
            endpoint = endpoints[step % len(endpoints)]
            step += 1
            path = path_for(endpoint, facts, rng)
            request = (
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"{auth if endpoint != 'healthz' else ''}\r\n"
            ).encode()
            started = time.perf_counter()
            try:
                status, body = await asyncio.wait_for(_exchange(reader, writer, request), 30)
                ok, what = status == 200, f"{status} {path}: {body[:200]!r}"
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
                ok, what = False, f"{type(exc).__name__} {path}: {exc}"
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            ms = (time.perf_counter() - started) * 1000
            if samples is not None:
                samples.add(endpoint, ms, ok, what)
            next_at += interval * rng.uniform(0.8, 1.2)
    finally:
        writer.close()


async def _load_async(
    port: int,
    facts: dict[str, Any],
    *,
    clients: int,
    seconds: float,
    rate: float,
    record: bool,
    endpoints: tuple[str, ...] = ENDPOINTS,
) -> Samples:
    samples = Samples()
    until = time.monotonic() + seconds
    await asyncio.gather(
        *(
            _client_async(
                i,
                port,
                facts,
                until=until,
                interval=1.0 / rate,
                samples=samples if record else None,
                endpoints=endpoints,
            )
            for i in range(clients)
        )
    )
    return samples


# -- server CPU, conditional reads, saturation, idle watches --------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def server_processes(master: int) -> list[int]:
    """`master` and every process under it (gunicorn's workers; granian's worker processes,
    started from any of the master's threads), from /proc."""
    pids, seen = [master], {master}
    for pid in pids:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in seen:
                    seen.add(child)
                    pids.append(child)
    return pids


def server_cpu_s(master: int) -> float:
    """User + system CPU seconds of the server's main process and every live process under
    it (from /proc), whichever server it is."""
    if not Path(f"/proc/{master}").exists():
        return float("nan")
    total = 0
    for pid in server_processes(master):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / _TICK


def postgres_backends(database: str | None) -> list[int]:
    """The PostgreSQL backend processes serving `database` on this machine, found by their
    process titles (``postgres: <user> <database> <host>(<port>) <state>``) in /proc."""
    if not database:
        return []
    needle = f" {database} ".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            title = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if title.startswith(b"postgres: ") and needle in title + b" ":
            found.append(int(entry.name))
    return found


def _ticks(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])  # utime, stime


class CpuMeter:
    """CPU seconds over a window of the web server's processes (`server_processes`) and of the
    PostgreSQL backends serving the bench's database (`postgres_backends`: they run the
    statements and, since 2026-11-27, render the lineage and log pages' JSON). Sampled every
    0.2 s from /proc, so a process that ends inside the window keeps what it used up to its
    last sample and one that starts inside it counts from zero."""

    def __init__(self, master: int, database: str | None) -> None:
        self.master = master
        self.database = database
        self._first: dict[tuple[str, int], int] = {}
        self._last: dict[tuple[str, int], int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = False

    def _sample(self) -> None:
        for group, pids in (
            ("web", server_processes(self.master)),
            ("postgres", postgres_backends(self.database)),
        ):
            for pid in pids:
                ticks = _ticks(pid)
                if ticks is None:
                    continue
                key = (group, pid)
                self._first.setdefault(key, ticks if not self._started else 0)
                self._last[key] = ticks

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._sample()

    def __enter__(self) -> CpuMeter:
        self._sample()
        self._started = True
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def seconds(self, group: str) -> float:
        ticks = sum(v - self._first[k] for k, v in self._last.items() if k[0] == group)
        return ticks / _TICK

    @property
    def web_s(self) -> float:
        return self.seconds("web")

    @property
    def postgres_s(self) -> float:
        return self.seconds("postgres")


def cost_per_request(meter: CpuMeter, requests: int) -> dict[str, float | int]:
    """Milliseconds of CPU per request: the web server's, PostgreSQL's and their sum."""
    n = max(requests, 1)
    web, pg = meter.web_s * 1000 / n, meter.postgres_s * 1000 / n
    return {
        "total": round(web + pg, 3),
        "web": round(web, 3),
        "postgres": round(pg, 3),
        "requests": requests,
    }


def class_costs(
    port: int,
    master: int,
    database: str | None,
    facts: dict[str, Any],
    *,
    clients: int,
    seconds: float,
    rate: float,
    mode: str,
) -> dict[str, Any]:
    """Per endpoint class, a window in which every client asks only for that class at the
    main window's rate: the server's and PostgreSQL's CPU over the window ÷ its requests.
    ``api`` is the three API classes together (healthz apart)."""
    costs: dict[str, Any] = {}
    totals = {"web": 0.0, "postgres": 0.0, "requests": 0}
    for endpoint in ENDPOINTS:
        with CpuMeter(master, database) as meter:
            samples = load(
                port,
                facts,
                clients=clients,
                seconds=seconds,
                rate=rate,
                record=True,
                mode=mode,
                endpoints=(endpoint,),
            )
        served = len(samples.latencies[endpoint])
        costs[endpoint] = {
            **cost_per_request(meter, served),
            "errors": samples.errors[endpoint],
            "p50_ms": round(percentile(samples.latencies[endpoint], 50), 2),
        }
        if endpoint in API_ENDPOINTS:
            totals["web"] += meter.web_s
            totals["postgres"] += meter.postgres_s
            totals["requests"] += served
    n = max(int(totals["requests"]), 1)
    web, pg = totals["web"] * 1000 / n, totals["postgres"] * 1000 / n
    costs["api"] = {
        "total": round(web + pg, 3),
        "web": round(web, 3),
        "postgres": round(pg, 3),
        "requests": int(totals["requests"]),
    }
    log(f"CPU per request by class (ms, web + PostgreSQL): {json.dumps(costs)}")
    return costs


def fetch(conn: http.client.HTTPConnection, path: str, headers: dict[str, str]) -> Any:
    conn.request("GET", path, headers=headers)
    response = conn.getresponse()
    response.read()
    return response


def conditional_load(
    port: int,
    master: int,
    facts: dict[str, Any],
    *,
    clients: int,
    seconds: float,
    rate: float,
    database: str | None = None,
) -> tuple[list[float], CpuMeter]:
    """Clients re-asking for what they hold (If-None-Match): latencies of the 304s, and the
    server's CPU seconds over the phase — from when every client holds its ETags (their
    first, full reads are not 304s and are not counted)."""
    latencies: list[float] = []
    lock = threading.Lock()
    ready = threading.Barrier(clients + 1)
    window = {"until": 0.0}

    def run(index: int) -> None:
        rng = random.Random(1000 + index)
        headers = {"Authorization": f"Token {facts['token']}", "Accept": "application/json"}
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        paths = [path_for(e, facts, rng) for e in API_ENDPOINTS]
        tags = {p: fetch(conn, p, headers).getheader("ETag") for p in paths}
        ready.wait()
        next_at = time.monotonic() + rng.random() / rate
        step = 0
        while True:
            now = time.monotonic()
            if next_at > now:
                time.sleep(next_at - now)
            if time.monotonic() >= window["until"]:
                break
            path = paths[step % len(paths)]
            step += 1
            started = time.perf_counter()
            response = fetch(conn, path, {**headers, "If-None-Match": tags[path] or ""})
            ms = (time.perf_counter() - started) * 1000
            if response.status == 304:
                with lock:
                    latencies.append(ms)
            else:
                tags[path] = response.getheader("ETag")
            next_at += rng.uniform(0.8, 1.2) / rate
        conn.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    window["until"] = time.monotonic() + 3600  # set for real once every client is ready
    ready.wait(timeout=120)
    with CpuMeter(master, database) as meter:
        window["until"] = time.monotonic() + seconds
        for thread in threads:
            thread.join(timeout=seconds + 120)
    return latencies, meter


def saturation(
    port: int,
    facts: dict[str, Any],
    *,
    clients: int,
    steps: list[float],
    seconds: float,
    mode: str,
) -> list[dict[str, Any]]:
    """Offered rate raised step by step until the API p99 passes 100 ms."""
    results = []
    for offered in steps:
        samples = load(
            port,
            facts,
            clients=clients,
            seconds=seconds,
            rate=offered / clients,
            record=True,
            mode=mode,
        )
        api = [v for e in API_ENDPOINTS for v in samples.latencies[e]]
        base = samples.latencies["healthz"]
        step = {
            "offered_rps": offered,
            "achieved_rps": round(sum(len(v) for v in samples.latencies.values()) / seconds, 1),
            "api_p99_ms": round(percentile(api, 99), 2),
            "healthz_p99_ms": round(percentile(base, 99), 2),
            "errors": sum(samples.errors.values()),
            "loadavg_1m": round(os.getloadavg()[0], 2),
        }
        log(f"saturation step: {step}")
        results.append(step)
        if step["api_p99_ms"] > 100 or step["errors"]:
            break
    return results


def idle_watch(
    port: int,
    master: int,
    facts: dict[str, Any],
    *,
    clients: int,
    seconds: float,
    hold: int,
    database: str | None = None,
) -> dict[str, Any]:
    """`clients` watching the job (``?watch=hold`` with its ETag) while nothing changes: the
    server's CPU per second over `seconds`."""
    stop = threading.Event()
    answers = {"304": 0, "200": 0, "busy": 0, "other": 0}
    lock = threading.Lock()
    path = f"/api/jobs/{JOB}/"

    def run() -> None:
        headers = {"Authorization": f"Token {facts['token']}", "Accept": "application/json"}
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=hold + 30)
        etag = fetch(conn, path, headers).getheader("ETag") or ""
        while not stop.is_set():
            try:
                response = fetch(conn, f"{path}?watch={hold}", {**headers, "If-None-Match": etag})
            except (OSError, http.client.HTTPException):
                break  # the server is going away at the end of the run
            kind = str(response.status) if response.status in (200, 304) else "other"
            if response.getheader("Epochal-Watch") == "busy":
                kind = "busy"
                time.sleep(1)
            with lock:
                answers[kind] += 1
            etag = response.getheader("ETag") or etag
        conn.close()

    threads = [threading.Thread(target=run, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(3)  # every watch established
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    with CpuMeter(master, database) as meter:
        time.sleep(seconds)
    elapsed = time.monotonic() - started
    stop.set()
    return {
        # the web server's and the PostgreSQL backends' CPU per second of wall time
        "idle_watch_cpu_ms_per_s": round((meter.web_s + meter.postgres_s) * 1000 / elapsed, 2),
        "idle_watch_postgres_cpu_ms_per_s": round(meter.postgres_s * 1000 / elapsed, 2),
        "idle_watch_clients": clients,
        "idle_watch_seconds": round(elapsed, 1),
        "idle_watch_hold_s": hold,
        "idle_watch_answers": dict(answers),
        "idle_watch_loadavg_1m": round((load_before + os.getloadavg()[0]) / 2, 2),
    }


# -- entry point ----------------------------------------------------------------------------


def summarise(
    samples: Samples, facts: dict[str, Any], args: argparse.Namespace, seconds: float
) -> dict[str, Any]:
    def ms(values: list[float], q: float) -> float:
        return round(percentile(values, q), 2)

    api = [v for e in API_ENDPOINTS for v in samples.latencies[e]]
    base = samples.latencies["healthz"]
    requests = sum(len(v) for v in samples.latencies.values())
    result: dict[str, Any] = {
        "clients": args.clients,
        "snapshots": facts["snapshots"],
        "branches": len(facts["branches"]),
        "database": facts["database"],
        "p50_ms": ms(api, 50),
        "p99_ms": ms(api, 99),
        "errors": sum(samples.errors.values()),
        "requests": requests,
        "seconds": args.seconds,
        "offered_rps": round(args.clients * args.rate, 1),
        "achieved_rps": round(requests / seconds, 1),
    }
    for endpoint in ENDPOINTS:
        values = samples.latencies[endpoint]
        prefix = "baseline_healthz" if endpoint == "healthz" else endpoint
        result[f"{prefix}_p50_ms"] = ms(values, 50)
        result[f"{prefix}_p99_ms"] = ms(values, 99)
        result[f"{prefix}_requests"] = len(values)
    if base:
        result["p50_vs_baseline"] = round(result["p50_ms"] / max(ms(base, 50), 0.01), 2)
        result["p99_vs_baseline"] = round(result["p99_ms"] / max(ms(base, 99), 0.01), 2)
    result.update(
        {
            "server": args.server,
            "server_workers": args.workers,
            "server_threads": args.threads,
            "db_pool": args.db_pool,
            "watch_slots": args.watch_slots,
            "load_client": args.load_client,
            "response_cache_bytes": args.response_cache_bytes,
            "build_seconds": round(facts["build_s"], 1),
            "cpus": os.cpu_count(),
            "step_seconds": args.step_seconds,
            **code_version(ROOT, "controlplane", "bench", "web"),
        }
    )
    return result


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.api", description=__doc__)
    parser.add_argument("--snapshots", type=int, default=100_000)
    parser.add_argument("--branches", type=int, default=100)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup-seconds", type=float, default=5.0)
    parser.add_argument("--rate", type=float, default=2.0, help="requests/s per client")
    parser.add_argument(
        "--server",
        choices=SERVERS,
        default="granian",
        help="the HTTP server of controlplane.wsgi: granian (Rust HTTP, WSGI on a pool of "
        "Python threads; the one deployed) or gunicorn (gthread workers; before 2026-11-27)",
    )
    parser.add_argument("--workers", type=int, default=2, help="server worker processes")
    parser.add_argument(
        "--threads", type=int, default=64, help="threads per worker (watches hold one each)"
    )
    parser.add_argument(
        "--watch-slots", type=int, default=56, help="EPOCHAL_WATCH_SLOTS per worker"
    )
    parser.add_argument(
        "--db-pool",
        type=int,
        default=8,
        help="EPOCHAL_DB_POOL_SIZE per worker (PostgreSQL connections; 0: one per thread)",
    )
    parser.add_argument("--conditional-seconds", type=float, default=10.0)
    parser.add_argument(
        "--class-seconds",
        type=float,
        default=10.0,
        help="seconds of each endpoint class's own window (the CPU per request by class)",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=3,
        help="runs of every phase against the same server; figures and verdicts are medians",
    )
    parser.add_argument(
        "--steps",
        default="100,200,300,400,500,600,800",
        help="offered req/s of the saturation steps (stops once the API p99 passes 100 ms)",
    )
    parser.add_argument(
        "--step-seconds",
        type=float,
        default=30.0,
        help="seconds per saturation step (30: as long as the main phase, so a step's healthz "
        "p99 rests on ~15 requests above it rather than ~5)",
    )
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--watch-hold", type=int, default=60, help="?watch= of idle watchers")
    parser.add_argument(
        "--load-client",
        choices=("asyncio", "threads"),
        default="asyncio",
        help="the paced clients of the main window and the saturation steps: one asyncio "
        "loop multiplexing them, or a Python thread each (the generator before 2026-11-27)",
    )
    parser.add_argument(
        "--response-cache-bytes",
        type=int,
        default=None,
        help="EPOCHAL_RESPONSE_CACHE_BYTES of the server (default: the setting's default)",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be >= 1")

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    os.environ["DJANGO_DEBUG"] = "false"
    # Outside debug the server needs a secret key; a fresh one per run, as a deployment has.
    os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
    if args.response_cache_bytes is not None:
        os.environ["EPOCHAL_RESPONSE_CACHE_BYTES"] = str(args.response_cache_bytes)
    base_url = os.environ.get("DATABASE_URL", "")
    if not base_url:
        log("DATABASE_URL is not set: using a scratch SQLite file (PostgreSQL is the target)")
    with scratch_database(base_url, args.keep) as url:
        os.environ["DATABASE_URL"] = url
        log(f"scratch database ready; building {args.snapshots:,} snapshots")
        facts = prepare(snapshots=args.snapshots, branches=args.branches, seed=args.seed)
        database = urlsplit(url).path.lstrip("/") if url.startswith("postgres") else None
        with serve(
            url,
            server=args.server,
            workers=args.workers,
            threads=args.threads,
            watch_slots=args.watch_slots,
            db_pool=args.db_pool,
        ) as (port, master):
            runs = []
            for index in range(args.runs):
                log(f"== run {index + 1} of {args.runs}")
                runs.append(one_run(port, master, database, facts, args))
    command = server_command(args.server, 0, workers=args.workers, threads=args.threads)
    result = combine(runs)
    # the server's settings as run (the port is the run's own)
    result["server_args"] = [a for a in command[3:] if not a.startswith(("--port", "--bind"))]
    result["server_version"] = _version(args.server)
    result["postgres_cpu_counted"] = database is not None
    errors = sum(int(run["errors"]) for run in runs) + sum(
        int(run["server_cpu_ms_per_request"][e]["errors"]) for run in runs for e in ENDPOINTS
    )
    result["errors_all_runs"] = errors
    log(
        f"median of {len(runs)} runs: API p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms; "
        f"verdicts {json.dumps({k: v['met'] for k, v in result['verdicts'].items()})}; "
        f"errors {errors}"
    )
    print(json.dumps(result))
    return 1 if errors else 0


#: the targets, each judged on the median of every run: (figure, its path in a run, bound)
TARGETS: tuple[tuple[str, tuple[str, ...], str, float], ...] = (
    ("server_cpu_ms_per_request.job", ("server_cpu_ms_per_request", "job", "total"), "<=", 3.0),
    (
        "server_cpu_ms_per_request.snapshots",
        ("server_cpu_ms_per_request", "snapshots", "total"),
        "<=",
        3.0,
    ),
    (
        "server_cpu_ms_per_request.lineage",
        ("server_cpu_ms_per_request", "lineage", "total"),
        "<=",
        3.0,
    ),
    ("server_cpu_ms_per_request.api", ("server_cpu_ms_per_request", "api", "total"), "<=", 3.0),
    ("saturation_rps", ("saturation_rps",), ">=", 400.0),
    ("p99_vs_healthz_at_200", ("p99_vs_healthz_at_200",), "<=", 2.0),
    ("idle_watch_cpu_ms_per_s", ("idle_watch_cpu_ms_per_s",), "<=", 5.0),
)


def _at(run: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = run
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _median(values: list[Any]) -> float | None:
    import statistics

    numbers = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    return round(statistics.median(numbers), 3) if numbers else None


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One report: every figure of the runs as its median over them (nested per endpoint
    class for the CPU), every run in ``runs``, and each target's verdict on its median."""
    first = runs[0]
    out: dict[str, Any] = {}
    for key, value in first.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            out[key] = value
        else:
            out[key] = _median([run.get(key) for run in runs])
    out["server_cpu_ms_per_request"] = {
        endpoint: {
            part: _median([run["server_cpu_ms_per_request"][endpoint][part] for run in runs])
            for part in ("total", "web", "postgres")
        }
        for endpoint in first["server_cpu_ms_per_request"]
    }
    verdicts = {}
    for name, path, bound, target in TARGETS:
        values = [_at(run, path) for run in runs]
        median = _median(values)
        met = median is not None and (median <= target if bound == "<=" else median >= target)
        verdicts[name] = {
            "target": f"{bound} {target:g}",
            "median": median,
            "runs": values,
            "met": met,
        }
    out["runs_count"] = len(runs)
    out["verdicts"] = verdicts
    out["runs"] = runs
    return out


def one_run(
    port: int, master: int, database: str | None, facts: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """Every phase once against the running server: warm-up, the main window, the CPU per
    endpoint class, conditional reads, saturation steps, idle watchers."""
    if args.warmup_seconds > 0:
        load(
            port,
            facts,
            clients=args.clients,
            seconds=args.warmup_seconds,
            rate=args.rate,
            record=False,
            mode=args.load_client,
        )
    load_before = os.getloadavg()[0]
    client_before = time.process_time()
    started = time.monotonic()
    with CpuMeter(master, database) as mixed:
        samples = load(
            port,
            facts,
            clients=args.clients,
            seconds=args.seconds,
            rate=args.rate,
            record=True,
            mode=args.load_client,
        )
    elapsed = time.monotonic() - started
    client_cpu = time.process_time() - client_before
    load_after = os.getloadavg()[0]
    log("CPU per endpoint class")
    by_class = class_costs(
        port,
        master,
        database,
        facts,
        clients=args.clients,
        seconds=args.class_seconds,
        rate=args.rate,
        mode=args.load_client,
    )
    load_classes = os.getloadavg()[0]
    log("conditional reads (If-None-Match)")
    not_modified, cpu_304 = conditional_load(
        port,
        master,
        facts,
        clients=args.clients,
        seconds=args.conditional_seconds,
        rate=args.rate,
        database=database,
    )
    load_304 = os.getloadavg()[0]
    log("saturation steps")
    steps = saturation(
        port,
        facts,
        clients=args.clients,
        steps=[float(x) for x in args.steps.split(",") if x],
        seconds=args.step_seconds,
        mode=args.load_client,
    )
    log(f"{args.clients} idle watchers for {args.idle_seconds:g}s")
    idle = idle_watch(
        port,
        master,
        facts,
        clients=args.clients,
        seconds=args.idle_seconds,
        hold=args.watch_hold,
        database=database,
    )
    result = summarise(samples, facts, args, elapsed)
    result["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result["loadavg_1m_before"] = round(load_before, 2)
    result["loadavg_1m_after"] = round(load_after, 2)
    result["loadavg_1m_classes"] = round(load_classes, 2)
    # per endpoint class, each in a window of its own: web server + PostgreSQL backends
    result["server_cpu_ms_per_request"] = by_class
    # the main window's mix (healthz included), web server + PostgreSQL backends
    result["server_cpu_ms_per_request_mixed"] = cost_per_request(mixed, result["requests"])
    # the load generator's own CPU (this process) over the main window, on the same cores
    result["client_cpu_ms_per_request"] = round(client_cpu * 1000 / max(result["requests"], 1), 2)
    result["p99_ms_304"] = round(percentile(not_modified, 99), 2) if not_modified else None
    result["p50_ms_304"] = round(percentile(not_modified, 50), 2) if not_modified else None
    result["requests_304"] = len(not_modified)
    result["server_cpu_ms_per_304"] = cost_per_request(cpu_304, len(not_modified))["total"]
    result["loadavg_1m_304"] = round(load_304, 2)
    good = [s["offered_rps"] for s in steps if s["api_p99_ms"] <= 100 and not s["errors"]]
    result["saturation_rps"] = max(good) if good else 0
    result["saturation_steps"] = steps
    at_200 = next((s for s in steps if s["offered_rps"] == 200), None)
    if at_200 is not None:
        result["p99_vs_healthz_at_200"] = round(
            at_200["api_p99_ms"] / max(at_200["healthz_p99_ms"], 0.01), 2
        )
    result.update(idle)
    for example in samples.error_examples:
        log(f"error: {example}")
    log(
        f"{result['requests']:,} requests in {elapsed:.0f}s: API p50 {result['p50_ms']} ms, "
        f"p99 {result['p99_ms']} ms, errors {result['errors']}; healthz p99 "
        f"{result['baseline_healthz_p99_ms']} ms"
    )
    return result


if __name__ == "__main__":
    raise SystemExit(main())
