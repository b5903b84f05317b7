"""The Celery broker goes away and comes back while operations are requested through the REST
API. The broker of this process and of a real Celery worker with its embedded beat (the
reconciler) is either a private ``redis-server`` (no persistence: a crash loses every queued
message), which the test kills (SIGKILL) and starts again on the same port, or a vhost of its
own on the shared RabbitMQ behind a proxy, which the test makes reset every connection and
each new one, then pass again (what the broker holds survives, as a RabbitMQ restart keeps
durable queues). `EPOCHAL_FAULT_INJECTIONS` times, in turn:

* operations are requested while the broker is down;
* operations are requested and sent while no worker consumes (stopped, as in a deploy), then
  the broker goes away with their messages still queued (Redis loses them, RabbitMQ keeps
  them), and a worker starts again.

An operation requested while the broker is down is either accepted — recorded, and run exactly
once after the broker is back: the reconciler dispatches operations that were recorded but
never reached a worker — or refused with 503, ``Retry-After`` and an error naming the broker,
leaving no row behind. An operation whose message the broker lost is dispatched again. None is
lost, none runs twice (counted from the operations and the audit of their phase executions),
and the beat keeps ticking after every outage.
"""

from __future__ import annotations

import datetime as dt
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
from django.db.models import F
from rest_framework.test import APIClient

from controlplane.accounts.services import user_create, user_token
from controlplane.audit.models import AuditEntry
from controlplane.jobs.selectors import runs_watched_at
from controlplane.operations.models import Operation, OperationState
from tests.api.conftest import build_lineage
from tests.conftest import require_service
from tests.e2e.harness import ControlPlane
from tests.faults.private_services import PrivateRedis, private_redis, rabbitmq_vhost
from tests.faults.report import injections, record

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

JOBS = ("clicks", "views")  # one operation per job and outage (a job runs one at a time)
OUTAGE_S = 1.0
#: the worker's lease: an operation whose message the broker lost is dispatched again after it
LEASE_S = 3.0
RECOVER_LIMIT_S = 60.0
HUNG_TIMEOUT_S = 1.0  # EPOCHAL_BROKER_TIMEOUT_S for the hung broker (default 5)


def _use_broker(url: str, timeout_s: float | None = None) -> None:
    """This process (the API's request path) sends its tasks to `url`, with the socket timeouts
    the settings give a Redis broker (`timeout_s`: none)."""
    from controlplane import config
    from controlplane.celery import app

    app.conf.broker_url = url
    # Celery prefers $CELERY_BROKER_URL (set in CI) to broker_url; the write and read URLs
    # come before both
    app.conf.broker_write_url = url
    app.conf.broker_read_url = url
    app.conf.broker_transport_options = (
        {} if timeout_s is None else config.redis_broker_options(timeout_s)
    )
    app._pool = None  # the connection pools remember the broker they were made for
    amqp = app.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None


@pytest.fixture
def broker() -> Iterator[PrivateRedis]:
    with private_redis(appendonly=False) as server:  # a crash loses what it held
        yield server


class Broker(Protocol):
    """What the outages need of a broker: where it is, and a way to take it away and back."""

    def url(self) -> str: ...
    def stop(self) -> None: ...
    def start(self) -> None: ...


@pytest.fixture(params=["redis", "rabbitmq"])
def outage_broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    """The broker the outages take away: the private Redis, or a private vhost on the shared
    RabbitMQ behind a proxy (never the shared broker itself, which others use)."""
    if request.param == "redis":
        yield request.getfixturevalue("broker")
        return
    with rabbitmq_vhost(request.getfixturevalue("rabbitmq_url")) as server:
        yield server


@pytest.fixture
def plane(tmp_path: Path, outage_broker: Broker, settings: Any) -> Iterator[ControlPlane]:
    """A Celery worker with its beat on the private broker and the test database; this process
    sends to the same broker and uses the same store root."""
    from django.conf import settings as django_settings
    from django.db import connection

    require_service(
        "PostgreSQL",
        connection.vendor == "postgresql",
        "the broker fault test shares its database with a worker: DATABASE_URL=postgres://…",
    )
    plane = ControlPlane(tmp_path, outage_broker.url(), lease_s=LEASE_S)
    settings.EPOCHAL_STORE_URL = plane.store_url
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    before = django_settings.CELERY_BROKER_URL
    _use_broker(outage_broker.url())
    try:
        yield plane
    finally:
        plane.stop_workers()
        _use_broker(before)


@pytest.fixture
def operator() -> APIClient:
    client = APIClient(raise_request_exception=False)  # as over HTTP: the server's answer
    client.default_format = "json"
    token = user_token(user=user_create(username="operator", role="operator"))
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def _ended(ids: set[str]) -> bool:
    return not Operation.objects.filter(pk__in=ids, state__in=["pending", "running"]).exists()


def _wait(what: str, done: Any, limit_s: float, plane: ControlPlane) -> float:
    began = time.monotonic()
    while not done():
        assert time.monotonic() - began < limit_s, f"{what}:\n{plane.worker_log()[-3000:]}"
        time.sleep(0.1)
    return time.monotonic() - began


def _request(operator: APIClient, job: str, tag: str) -> tuple[str, str | None]:
    """Ask for a savepoint of `job` tagged `tag`; ("accepted", id) or ("refused", None)."""
    response = operator.post(
        f"/api/jobs/{job}-main/operations/",
        {"kind": "savepoint", "params": {"name": tag}},
        HTTP_IDEMPOTENCY_KEY=f"{job}-{tag}",
    )
    if response.status_code == 202:
        return "accepted", str(response.json()["id"])
    # refused: clearly, naming the broker, and nothing recorded
    assert response.status_code == 503, (response.status_code, response.content[:400])
    assert response["Retry-After"]
    assert response.json()["error"]["code"] == "broker_unavailable", response.content[:400]
    assert not Operation.objects.filter(idempotency_key=f"{job}-{tag}").exists()
    return "refused", None


def _undispatched(operator: APIClient) -> int:
    """`epochal_operations_undispatched` as `/metrics` answers it."""
    response = operator.get("/metrics")
    assert response.status_code == 200, response.content[:300]
    for line in response.content.decode().splitlines():
        if line.startswith("epochal_operations_undispatched "):
            return int(float(line.split()[1]))
    raise AssertionError("/metrics has no epochal_operations_undispatched")


def _executions(op: Operation) -> tuple[int, dict[str, int]]:
    """How often `op` was started, and how often each of its phases succeeded (the audit)."""
    rows = AuditEntry.objects.filter(operation=op).values_list("action", "outcome")
    started = sum(1 for action, outcome in rows if outcome in ("started", "resumed"))
    phases: dict[str, int] = {}
    for action, outcome in rows:
        if outcome == "succeeded" and action.count(".") == 2:
            phases[action] = phases.get(action, 0) + 1
    return started, phases


Requested = list[tuple[str, str | None]]


def _requested_while_down(
    operator: APIClient, broker: Broker, plane: ControlPlane, tag: str
) -> Requested:
    """The broker crashes; operations are requested while it is away; it comes back."""
    broker.stop()  # SIGKILL, or every connection reset
    requested = [_request(operator, job, tag) for job in JOBS]
    accepted = sum(i is not None for _, i in requested)
    # recorded, held by no worker, and counted where an operator looks
    assert _undispatched(operator) == accepted
    time.sleep(OUTAGE_S)
    broker.start()
    return requested


def _queue_lost(operator: APIClient, broker: Broker, plane: ControlPlane, tag: str) -> Requested:
    """Operations are requested and sent while no worker consumes (the worker stopped, as in a
    deploy), then the broker goes away: a Redis without persistence comes back without the
    messages it queued, RabbitMQ with them; the worker's beat is gone until a new worker starts.

    (Not a frozen worker: SIGSTOP may catch it inside a transaction — the reconciler's lineage
    pass locks the application row — and the request's insert would wait on that lock.)"""
    plane.stop_workers()
    requested = [_request(operator, job, tag) for job in JOBS]
    broker.stop()  # Redis: SIGKILL, its queues were in memory only
    time.sleep(OUTAGE_S)
    broker.start()
    plane.start_worker()
    return requested


#: the two ways an outage meets operations, taken in turn
INJECTIONS = (_requested_while_down, _queue_lost)


def test_operations_requested_around_broker_crashes_run_exactly_once(
    plane: ControlPlane, outage_broker: Broker, operator: APIClient
) -> None:
    for name in JOBS:
        build_lineage(name)
    plane.start_worker()
    # the worker and its beat are up: an operation requested now runs
    state, warm = _request(operator, JOBS[0], "warm-up")
    assert state == "accepted" and warm is not None
    _wait("the warm-up savepoint to end", lambda: _ended({warm}), 90, plane)

    accepted: set[str] = {warm}
    refused = 0
    recover_s: list[float] = []
    wanted = injections()
    for n in range(wanted):
        inject = INJECTIONS[n % len(INJECTIONS)]
        requested = inject(operator, outage_broker, plane, f"outage-{n}")
        back = time.monotonic()
        ids = {i for _, i in requested if i is not None}
        refused += sum(state == "refused" for state, _ in requested)
        accepted |= ids
        _wait(f"the operations of outage {n} to end", lambda ids=ids: _ended(ids),
              RECOVER_LIMIT_S, plane)  # fmt: skip
        recover_s.append(time.monotonic() - back)
        # the beat survived: the reconciler's run watch passes again after the outage
        since = runs_watched_at()
        _wait("the reconciler to tick after the outage",
              lambda since=since: (runs_watched_at() or since) != since, 30, plane)  # fmt: skip

    operations = list(Operation.objects.filter(kind="savepoint"))
    assert {str(op.pk) for op in operations} == accepted  # every refusal left no row
    lost = [op for op in operations if op.state != OperationState.SUCCEEDED]
    duplicated = 0
    for op in operations:
        started, phases = _executions(op)
        duplicated += max(0, started - 1) + sum(max(0, n - 1) for n in phases.values())
        assert started == 1 and set(phases.values()) == {1}, (op.pk, started, phases)
    assert not lost, [(op.pk, op.state, op.error_message) for op in lost]
    survived = sum(
        1 for n in range(wanted)
        if all(op.state == OperationState.SUCCEEDED for op in operations
               if op.params.get("name") == f"outage-{n}")
    )  # fmt: skip
    fault_class = "broker" if isinstance(outage_broker, PrivateRedis) else "broker_rabbitmq"
    record(fault_class, injected=wanted, survived=survived, lost=len(lost), duplicated=duplicated,
           recover_s=recover_s)  # fmt: skip
    assert len(accepted) + refused == 1 + wanted * len(JOBS)


def test_a_reconciler_pass_that_meets_no_broker_gives_its_claims_back(
    outage_broker: Broker, caplog: pytest.LogCaptureFixture, settings: Any, tmp_path: Path
) -> None:
    """The beat delivered the tick, then the broker went: the pass dispatches nothing, leaves
    every operation as it found it (the next pass dispatches them, not one a lease later) and
    says which broker it could not reach."""
    from kombu.utils.url import maybe_sanitize_url

    from controlplane.operations.reconciler import reconcile_operations
    from controlplane.operations.services import operation_request

    settings.EPOCHAL_STORE_URL = f"file://{tmp_path / 'store'}"
    lineages = [build_lineage(name) for name in JOBS]
    ops = [
        operation_request(kind="savepoint", application=lin.application, job=lin.job,
                          params={"name": "sp"}, dispatch=False).operation
        for lin in lineages
    ]  # fmt: skip
    Operation.objects.filter(pk__in=[op.pk for op in ops]).update(
        created_at=F("created_at") - dt.timedelta(seconds=10)  # older than a dispatch takes
    )
    before = settings.CELERY_BROKER_URL
    _use_broker(outage_broker.url())
    try:
        outage_broker.stop()
        assert reconcile_operations() == 0
        rows = Operation.objects.filter(pk__in=[op.pk for op in ops])
        assert {(r.lease_owner, r.lease_expires_at) for r in rows} == {("", None)}
        named = maybe_sanitize_url(outage_broker.url())  # redis://…, amqp://guest:**@…
        assert f"the broker ({named}) is unavailable" in caplog.text
        outage_broker.start()
        assert reconcile_operations() == len(ops)  # the next pass dispatches them all
    finally:
        _use_broker(before)


def test_a_hung_broker_does_not_hold_an_operation_request(
    broker: PrivateRedis, operator: APIClient, settings: Any, tmp_path: Path
) -> None:
    """A broker that accepts connections and never answers (SIGSTOPped: paused, hung, behind a
    partition that drops packets): the request is answered within the broker timeout, the
    operation recorded and left for the reconciler, which dispatches it once the broker
    answers again."""
    from controlplane.operations.reconciler import reconcile_operations

    settings.EPOCHAL_STORE_URL = f"file://{tmp_path / 'store'}"
    build_lineage(JOBS[0])
    before = settings.CELERY_BROKER_URL
    _use_broker(broker.url(), timeout_s=HUNG_TIMEOUT_S)
    assert broker.proc is not None
    try:
        broker.proc.send_signal(signal.SIGSTOP)
        began = time.monotonic()
        state, op_id = _request(operator, JOBS[0], "hung")
        took = time.monotonic() - began
        assert took < 4 * HUNG_TIMEOUT_S + 2, took  # a send and its one retry, not for ever
        assert state == "accepted" and op_id is not None
        assert _undispatched(operator) == 1
        broker.proc.send_signal(signal.SIGCONT)
        Operation.objects.filter(pk=op_id).update(
            created_at=F("created_at") - dt.timedelta(seconds=10)
        )
        assert reconcile_operations() == 1
    finally:
        broker.proc.send_signal(signal.SIGCONT)
        _use_broker(before)
