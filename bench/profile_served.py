"""Where the served process's CPU goes: `python -m bench.profile_served [--rate-total 100]`.

`bench.profile_api` profiles one request at a time in-process; this one samples the real
server instead. It builds `bench.api`'s scratch database, serves it with `--server`
(gunicorn or granian) the way `bench.api` does, sends `bench.api`'s request mix from
`--clients` keep-alive clients at `--rate-total` requests/s, and meanwhile samples every
worker process with py-spy (``py-spy record --format raw --nonblocking``: on-CPU stacks
only, the worker not paused). Each sample is charged to a part by its innermost frame (the
same parts as `bench.profile_api`, plus the server's own: `gunicorn` or `granian`,
`threads` (locks, queues, thread pools, selectors), `pool` (psycopg_pool), `logging`), and
to a phase by the outermost frame of ours it passed through (`middleware`, `auth`,
`throttle`, `view`, `render`, …). py-spy sees Python frames only: granian's Rust side (HTTP
parsing, writing) is in the measured CPU but in no phase.

py-spy must be on PATH (requirements/dev.in). The last stdout line is one JSON object: the
server's CPU ms per request measured from /proc (as `bench.api` does), the samples, ms per
request per part and per phase (the shares of samples applied to the measured CPU), the
heaviest leaf functions, the server and its shape and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.api import (
    _TICK,
    SERVERS,
    load,
    log,
    prepare,
    scratch_database,
    serve,
    server_cpu_s,
    server_processes,
)
from bench.profile_api import PARTS

SERVER_PARTS = (
    ("gunicorn", ("gunicorn/",)),
    ("granian", ("granian/",)),
    ("pool", ("psycopg_pool/",)),
    ("logging", ("logging/",)),
    (
        "threads",
        ("threading.py", "queue.py", "concurrent/futures", "selectors.py", "socket.py", "ssl.py"),
    ),
)

# The phase of a request: the innermost of these a stack passes through wins, so a query
# run by the authentication is `auth`, one run by the view is `view`.
PHASES = (
    ("render", ("rest_framework/renderers", "rest_framework/negotiation", "response.py:render")),
    ("audit", ("controlplane/audit/", "audit_api_request")),
    ("throttle", ("rest_framework/throttling", "ApiThrottle")),
    ("auth", ("rest_framework/authentication", "controlplane/accounts/", "permissions")),
    ("view", ("controlplane/api/views", "web/views")),
    ("signals", ("close_old_connections", "request_finished", "request_started")),
    ("middleware", ("django/middleware", "django/contrib/", "whitenoise", "django_htmx", "axes")),
    ("django", ("django/core/handlers", "rest_framework/views")),
    ("gunicorn", ("gunicorn/",)),
    ("granian", ("granian/",)),
)


def part_of(frame: str) -> str:
    for name, needles in (*SERVER_PARTS, *PARTS):
        if any(n in frame for n in needles):
            return name
    return "other"


def phase_of(frames: list[str]) -> str:
    for frame in reversed(frames):  # innermost first
        for name, needles in PHASES:
            if any(n in frame for n in needles):
                return name
    return "other"


def parse_raw(text: str) -> list[tuple[list[str], int]]:
    """py-spy's raw format: ``frame;frame;… count`` per line, outermost frame first."""
    stacks = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks.append((stack.split(";"), int(count)))
    return stacks


def thread_cpu_s(pids: list[int]) -> dict[str, float]:
    """CPU seconds of the workers' main threads (gunicorn's event loop; granian's main
    thread only waits) and of all their other threads (the request threads, the change
    listener, granian's Rust runtime), from /proc."""
    split = {"main": 0.0, "others": 0.0}
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            ticks = int(fields[11]) + int(fields[12])
            split["main" if int(task.name) == pid else "others"] += ticks / _TICK
    return split


def record(
    pids: list[int], seconds: float, rate: int, folder: Path, extra: list[str]
) -> list[Path]:
    beside = Path(sys.executable).parent / "py-spy"  # the venv's, when not on PATH
    spy = str(beside) if beside.exists() else shutil.which("py-spy")
    if spy is None:
        raise SystemExit("py-spy is not on PATH (requirements/dev.in installs it)")
    procs, outputs = [], []
    for pid in pids:
        out = folder / f"{pid}.txt"
        outputs.append(out)
        procs.append(
            subprocess.Popen(
                [
                    spy,
                    "record",
                    "--pid",
                    str(pid),
                    "--duration",
                    str(int(seconds)),
                    "--rate",
                    str(rate),
                    "--format",
                    "raw",
                    "--output",
                    str(out),
                    *extra,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        )
    for proc in procs:
        _, err = proc.communicate(timeout=seconds + 60)
        if proc.returncode != 0:
            raise SystemExit(f"py-spy failed: {err.decode(errors='replace')[-500:]}")
    return outputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_served", description=__doc__)
    parser.add_argument("--snapshots", type=int, default=100_000)
    parser.add_argument("--branches", type=int, default=100)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--rate-total", type=float, default=100.0, help="requests/s offered")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--sample-rate", type=int, default=200, help="py-spy samples/s")
    parser.add_argument("--server", choices=SERVERS, default="granian")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--watch-slots", type=int, default=56)
    parser.add_argument("--db-pool", type=int, default=8)
    parser.add_argument("--top", type=int, default=25, help="leaf functions listed")
    parser.add_argument(
        "--gil", action="store_true", help="only samples of the thread holding the GIL"
    )
    parser.add_argument("--blocking", action="store_true", help="pause the workers for each sample")
    parser.add_argument("--stacks", type=Path, help="also write the raw stacks to this file")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    os.environ["DJANGO_DEBUG"] = "false"
    os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
    rate = args.rate_total / args.clients
    with scratch_database(os.environ.get("DATABASE_URL", ""), False) as url:
        os.environ["DATABASE_URL"] = url
        facts = prepare(snapshots=args.snapshots, branches=args.branches, seed=args.seed)
        with serve(
            url,
            server=args.server,
            workers=args.workers,
            threads=args.threads,
            watch_slots=args.watch_slots,
            db_pool=args.db_pool,
        ) as (port, master):
            load(port, facts, clients=args.clients, seconds=3, rate=rate, record=False)
            pids = server_processes(master)[1:]  # the workers (py-spy samples each)
            load_before = os.getloadavg()[0]
            with tempfile.TemporaryDirectory(prefix="profile-served-") as folder:
                result_box: dict[str, Any] = {}

                def drive() -> None:
                    result_box["samples"] = load(
                        port,
                        facts,
                        clients=args.clients,
                        seconds=args.seconds,
                        rate=rate,
                        record=True,
                    )

                cpu_before = server_cpu_s(master)
                threads_before = thread_cpu_s(pids)
                driver = threading.Thread(target=drive)
                driver.start()
                time.sleep(0.5)
                extra = ["--gil"] if args.gil else []
                extra += [] if args.blocking else ["--nonblocking"]
                outputs = record(pids, args.seconds - 1.5, args.sample_rate, Path(folder), extra)
                driver.join()
                cpu = server_cpu_s(master) - cpu_before
                threads_after = thread_cpu_s(pids)
                raw = "\n".join(out.read_text() for out in outputs)
                if args.stacks is not None:
                    args.stacks.write_text(raw)
                stacks = parse_raw(raw)
    samples = result_box["samples"]
    requests = sum(len(v) for v in samples.latencies.values())
    total = sum(n for _, n in stacks) or 1
    cpu_ms = cpu * 1000 / max(requests, 1)
    parts: Counter[str] = Counter()
    phases: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    for frames, n in stacks:
        parts[part_of(frames[-1])] += n
        phases[phase_of(frames)] += n
        leaves[frames[-1]] += n

    def per_request(counts: Counter[str]) -> dict[str, float]:
        return {k: round(v / total * cpu_ms, 3) for k, v in counts.most_common()}

    result = {
        "server_cpu_ms_per_request": round(cpu_ms, 3),
        "requests": requests,
        "errors": sum(samples.errors.values()),
        "samples": total,
        "thread_cpu_ms_per_request": {
            k: round((threads_after[k] - threads_before[k]) * 1000 / max(requests, 1), 3)
            for k in threads_after
        },
        "parts_ms": per_request(parts),
        "phases_ms": per_request(phases),
        "top_leaves": [
            [leaf, round(n / total * cpu_ms, 3)] for leaf, n in leaves.most_common(args.top)
        ],
        "server": args.server,
        "rate_total": args.rate_total,
        "clients": args.clients,
        "workers": args.workers,
        "threads": args.threads,
        "db_pool": args.db_pool,
        "snapshots": facts["snapshots"],
        "loadavg_1m_before": round(load_before, 2),
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
    }
    for name, value in result["phases_ms"].items():
        log(f"phase {name}: {value} ms/request")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
