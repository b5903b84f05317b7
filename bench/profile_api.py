"""Where one API request's server time goes: `python -m bench.profile_api [--snapshots N]`.

Builds the same scratch database as `bench.api` (a bulk-loaded lineage, a version, a job on
`main`, a viewer token) and adds a running operation with a run, then sends each endpoint
`--requests` times through Django's full WSGI stack in this process (middleware,
authentication, permissions, throttling, view, serializer, renderer, audit) under cProfile.
Each function's own time is charged to one part by where its code lives:

  orm          django.db, psycopg (SQL building, round trips, row conversion)
  serializer   rest_framework serializers and fields, controlplane/api/serializers.py
  auth         authentication, permissions, throttling, roles, tokens
  audit        controlplane/audit, the API's audit hook
  middleware   django.middleware, sessions, auth middleware, whitenoise, django-htmx, handlers
  rendering    rest_framework renderers and negotiation, json
  routing      django.urls
  view         the rest of controlplane (views, selectors)
  other        everything else (Python's own, logging, …)

The last stdout line is one JSON object: per endpoint the wall and CPU ms per request,
queries per request and ms per part; plus the load average. Runs on any revision of the
repository that has `bench.api.prepare`, so before/after comparisons use the same script.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import secrets
import time
from pathlib import Path
from typing import Any

from bench.api import JOB, log, prepare, scratch_database

PARTS = (
    ("audit", ("controlplane/audit/",)),
    (
        "auth",
        (
            "rest_framework/authentication",
            "rest_framework/permissions",
            "rest_framework/throttling",
            "controlplane/api/permissions",
            "controlplane/api/authentication",
            "controlplane/accounts/",
            "django/contrib/auth/",
            "rest_framework/authtoken",
        ),
    ),
    (
        "serializer",
        (
            "rest_framework/serializers",
            "rest_framework/fields",
            "controlplane/api/serializers",
            "rest_framework/relations",
        ),
    ),
    (
        "rendering",
        (
            "rest_framework/renderers",
            "rest_framework/negotiation",
            "json/",
            "rest_framework/utils/encoders",
            "rest_framework/response",
        ),
    ),
    ("orm", ("django/db/", "psycopg")),
    (
        "middleware",
        (
            "django/middleware/",
            "django/contrib/sessions",
            "whitenoise",
            "django_htmx",
            "django/core/handlers",
            "django/contrib/messages",
            "django/test/",
        ),
    ),
    ("routing", ("django/urls/",)),
    ("view", ("controlplane/", "rest_framework/")),
)


def part_of(filename: str) -> str:
    for name, needles in PARTS:
        if any(n in filename for n in needles):
            return name
    return "other"


def profile(client: Any, path: str | list[str], headers: dict[str, str], n: int) -> dict[str, Any]:
    """`n` requests of `path`, or of distinct paths (as `bench.api`'s random pages): the
    warm-up, the unprofiled pass and the profiled pass each ask paths the others did not."""
    from django.db import connection

    paths = [path] if isinstance(path, str) else path
    for i in range(3):  # warm caches (application ids, compiled templates)
        client.get(paths[(2 * n + i) % len(paths)], **headers)
    statements = [0]

    def count(execute: Any, sql: Any, params: Any, many: Any, context: Any) -> Any:
        statements[0] += 1
        return execute(sql, params, many, context)

    backend = _backend_cpu_s()
    plain = time.process_time()  # the same requests without the profiler's overhead
    for i in range(n):
        client.get(paths[(n + i) % len(paths)], **headers)
    plain = time.process_time() - plain
    backend_after = _backend_cpu_s()
    # None when the connection was replaced between (its age passed CONN_MAX_AGE)
    db_ms = (
        round((backend_after[1] - backend[1]) * 1000 / n, 2)
        if backend[0] and backend[0] == backend_after[0]
        else None
    )
    profiler = cProfile.Profile()
    wall, cpu = time.perf_counter(), time.process_time()
    status = 0
    with connection.execute_wrapper(count):
        profiler.enable()
        for i in range(n):
            status = client.get(paths[i % len(paths)], **headers).status_code
        profiler.disable()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    queries = statements[0] / n
    parts: dict[str, float] = {}
    for (filename, _, _), (_, _, tottime, _, _) in pstats.Stats(profiler).stats.items():  # type: ignore[attr-defined]
        key = part_of(filename)
        parts[key] = parts.get(key, 0.0) + tottime
    total = sum(parts.values()) or 1.0
    return {
        "status": status,
        "wall_ms": round(wall * 1000 / n, 2),
        "cpu_ms": round(cpu * 1000 / n, 2),
        "cpu_ms_unprofiled": round(plain * 1000 / n, 2),
        # The database server's side of the same (unprofiled) requests: PostgreSQL's backend
        # process for this connection, from /proc (None elsewhere).
        "db_cpu_ms_unprofiled": db_ms,
        "queries": round(queries, 2),
        # cProfile's own overhead inflates the parts alike: they are shares of the CPU time.
        "parts_ms": {k: round(v / total * cpu * 1000 / n, 2) for k, v in sorted(parts.items())},
    }


def _backend_cpu_s() -> tuple[int, float]:
    """(pid, CPU seconds) of the PostgreSQL backend serving this process's connection
    ((0, 0.0) when the database is not a local PostgreSQL)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return 0, 0.0
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = int(cursor.fetchone()[0])
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0, 0.0
    return pid, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_api", description=__doc__)
    parser.add_argument("--snapshots", type=int, default=100_000)
    parser.add_argument("--branches", type=int, default=100)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--no-response-cache",
        action="store_true",
        help="EPOCHAL_RESPONSE_CACHE_BYTES=0: every request builds its answer",
    )
    args = parser.parse_args(argv)
    if args.no_response_cache:
        os.environ["EPOCHAL_RESPONSE_CACHE_BYTES"] = "0"

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    os.environ["DJANGO_DEBUG"] = "false"
    os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
    os.environ["EPOCHAL_API_RATE"] = "1000000000/hour"
    os.environ["DJANGO_ALLOWED_HOSTS"] = "testserver"
    with scratch_database(os.environ.get("DATABASE_URL", ""), False) as url:
        os.environ["DATABASE_URL"] = url
        facts = prepare(snapshots=args.snapshots, branches=args.branches, seed=args.seed)
        from django.test import Client

        from controlplane.jobs.models import Job, Run
        from controlplane.operations.models import Operation

        job = Job.objects.get(name=JOB)
        operation = Operation.objects.create(
            kind="savepoint",
            application=job.application,
            job=job,
            state="running",
            phases=[{"name": "commit", "state": "running", "progress": 0.5, "detail": ""}],
        )
        Run.objects.create(job=job, run_id="r1", runner="local", parallelism=2, spec={})
        app, branch = facts["application"], facts["branches"][len(facts["branches"]) // 2]
        low, high = facts["pk_range"]
        rng = random.Random(args.seed)
        endpoints: dict[str, str | list[str]] = {
            "healthz": "/healthz",
            "job": f"/api/jobs/{JOB}/",
            "operation": f"/api/operations/{operation.pk}/",
            "log": f"/api/applications/{app}/snapshots/?rev=heads/{branch}&limit=50",
            "log_first_parent": (
                f"/api/applications/{app}/snapshots/?rev=heads/{branch}&limit=50&first_parent=true"
            ),
            "lineage": f"/api/applications/{app}/lineage/?limit=100&cursor={(low + high) // 2}",
            # As bench.api asks it: a random cursor each time, which no kept answer serves.
            "lineage_random": [
                f"/api/applications/{app}/lineage/?limit=100&cursor={rng.randint(low + 100, high)}"
                for _ in range(2 * args.requests + 3)
            ],
            "branches": f"/api/applications/{app}/branches/",
            "jobs": "/api/jobs/",
            "operations": "/api/operations/",
        }
        client = Client()
        auth = {"HTTP_AUTHORIZATION": f"Token {facts['token']}", "HTTP_ACCEPT": "application/json"}
        load_before = os.getloadavg()[0]
        result: dict[str, Any] = {"snapshots": facts["snapshots"], "requests": args.requests}
        for name, path in endpoints.items():
            headers = {} if name == "healthz" else auth
            result[name] = profile(client, path, headers, args.requests)
            log(f"{name}: {result[name]}")
            etag = client.get(path, **headers).get("ETag") if isinstance(path, str) else None
            if etag:
                result[f"{name}_304"] = profile(
                    client, path, {**headers, "HTTP_IF_NONE_MATCH": etag}, args.requests
                )
                log(f"{name} 304: {result[f'{name}_304']}")
        from django.db import connections

        connections.close_all()
    result["loadavg_1m_before"] = round(load_before, 2)
    result["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    result["cpus"] = os.cpu_count()
    result["response_cache"] = not args.no_response_cache
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
