"""Every malformed request gets a 4xx naming what is wrong, through the real HTTP stack (a live
server), and leaves nothing written: NUL and lone surrogates, an oversized body, deep
nesting, unknown fields, wrong types (no coercion), unbounded timeouts, concurrent creates of
one name. Refused writes are audited with the fields they named."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from controlplane.applications.models import Application, ApplicationVersion
from controlplane.audit.models import AuditEntry
from controlplane.jobs.models import Job
from controlplane.operations.models import Operation
from tests.api.conftest import Lineage

pytestmark = pytest.mark.django_db(transaction=True)


class Api:
    def __init__(self, base: str, token: str) -> None:
        self.base = base
        self.headers = {"Authorization": f"Token {token}", "Connection": "close"}

    def send(
        self, method: str, path: str, body: Any = None, raw: bytes | None = None, **headers: str
    ) -> requests.Response:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        return requests.request(
            method,
            f"{self.base}{path}",
            data=data,
            headers={**self.headers, "Content-Type": "application/json", **headers},
            timeout=120,
        )


@pytest.fixture
def admin(live_server: Any, lineage: Lineage, tokens: dict[str, str]) -> Api:
    return Api(live_server.url, tokens["admin"])


@pytest.fixture
def operator(live_server: Any, lineage: Lineage, tokens: dict[str, str]) -> Api:
    return Api(live_server.url, tokens["operator"])


def refused(response: requests.Response, status: int, field: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert field in error["fields"], error
    return error


def test_nul_and_lone_surrogates_anywhere_in_json_are_400_naming_the_place(admin: Api) -> None:
    versions = ApplicationVersion.objects.count()
    nul = admin.send(
        "POST",
        "/api/applications/clicks/versions/",
        raw=b'{"job": "a:b", "config": {"args": ["x", "a\\u0000b"]}}',
    )
    assert "NUL" in refused(nul, 400, "config.args.1")["message"]
    surrogate_value = admin.send(
        "POST", "/api/applications/clicks/versions/", raw=b'{"job": "a:b", "reason": "\\ud800"}'
    )
    assert "surrogate" in refused(surrogate_value, 400, "reason")["message"]
    surrogate_key = admin.send(
        "POST",
        "/api/applications/clicks/versions/",
        raw=b'{"job": "a:b", "config": {"\\udfff": 1}}',
    )
    refused(surrogate_key, 400, "config.?")
    not_utf8 = admin.send("POST", "/api/applications/", raw=b'{"name": "\xff"}')
    refused(not_utf8, 400, "body")
    nan = admin.send("POST", "/api/applications/", raw=b'{"name": "n", "max_parallelism": NaN}')
    refused(nan, 400, "body")
    query = admin.send("GET", "/api/operations/?job=a%00b")
    refused(query, 400, "job")
    assert ApplicationVersion.objects.count() == versions
    # The refused write is audited with the field it named.
    entries = AuditEntry.objects.filter(status_code=400, target__endswith="/versions/")
    assert [e.detail["fields"] for e in entries.order_by("id")][:3] == [
        ["config.args.1"],
        ["reason"],
        ["config.?"],
    ]


def test_a_body_over_the_limit_is_413_not_a_500(admin: Api, settings: Any) -> None:
    ten_mb = json.dumps({"name": "big", "description": "x" * (10 * 1024 * 1024)}).encode()
    response = admin.send("POST", "/api/applications/", raw=ten_mb)
    error = refused(response, 413, "body")
    assert error["code"] == "body_too_large"
    assert error["detail"]["limit_bytes"] == settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    assert not Application.objects.filter(name="big").exists()


def test_nesting_over_the_depth_limit_is_400_without_a_recursion_error(admin: Api) -> None:
    from controlplane.api.parsers import MAX_DEPTH

    very_deep = b'{"job": "a:b", "config": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    response = admin.send("POST", "/api/applications/clicks/versions/", raw=very_deep)
    assert refused(response, 400, "body")["code"] == "too_deep"
    just_over = {"job": "a:b", "config": {}}
    node = just_over["config"]
    for _ in range(MAX_DEPTH):
        node["k"] = {}
        node = node["k"]
    response = admin.send("POST", "/api/applications/clicks/versions/", just_over)
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "too_deep"
    assert any(name.startswith("config.k.k") for name in error["fields"])


WRITES = [
    ("POST", "/api/applications/", {"name": "fresh"}),
    ("POST", "/api/applications/clicks/versions/", {"job": "clickstream"}),
    ("POST", "/api/jobs/", {"name": "fresh-job", "application": "clicks", "branch": "b2"}),
    ("POST", "/api/jobs/clicks-main/operations/", {"kind": "savepoint"}),
    ("POST", "/api/applications/clicks/operations/", {"kind": "fork", "params": {}}),
    ("POST", "/api/users/", {"username": "newbie", "role": "viewer"}),
    ("PATCH", "/api/users/viewer/", {"role": "operator"}),
    ("PATCH", "/api/jobs/clicks-main/autoscaler/", {"mode": "recommend"}),
    ("PATCH", "/api/jobs/clicks-main/savepoint-schedule/", {"interval_s": 60}),
]


@pytest.mark.parametrize(("method", "path", "body"), WRITES, ids=[w[1] for w in WRITES])
def test_unknown_fields_are_400_on_every_write_endpoint(
    admin: Api, method: str, path: str, body: dict[str, Any]
) -> None:
    before = (Application.objects.count(), Job.objects.count(), Operation.objects.count())
    response = admin.send(method, path, {**body, "is_superuser": True})
    assert "unknown field" in refused(response, 400, "is_superuser")["fields"]["is_superuser"][0]
    assert before == (Application.objects.count(), Job.objects.count(), Operation.objects.count())


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "typed", "max_parallelism": "3"}, "max_parallelism"),
        ({"name": "typed", "max_parallelism": 3.0}, "max_parallelism"),
        ({"name": "typed", "max_parallelism": True}, "max_parallelism"),
        ({"name": 3}, "name"),
        ({"name": ["typed"]}, "name"),
    ],
)
def test_wrong_types_are_400_and_never_coerced(
    admin: Api, body: dict[str, Any], field: str
) -> None:
    response = admin.send("POST", "/api/applications/", body)
    assert "must be" in refused(response, 400, field)["fields"][field][0]
    assert not Application.objects.filter(name="typed").exists()


def test_job_booleans_and_integers_are_not_coerced(admin: Api) -> None:
    body = {"name": "typed-job", "application": "clicks", "branch": "b3"}
    refused(admin.send("POST", "/api/jobs/", {**body, "follow": 1}), 400, "follow")
    refused(admin.send("POST", "/api/jobs/", {**body, "parallelism": "2"}), 400, "parallelism")
    assert not Job.objects.filter(name="typed-job").exists()


def test_timeouts_are_bounded(operator: Api) -> None:
    response = operator.send(
        "POST",
        "/api/jobs/clicks-main/operations/",
        {"kind": "savepoint", "params": {"timeout_s": 10**9}},
    )
    assert "at most 86400" in refused(response, 400, "timeout_s")["message"]
    assert not Operation.objects.exists()


def test_three_concurrent_creates_of_one_name_are_one_201_and_409s(
    postgresql_db: None, admin: Api
) -> None:
    barrier = threading.Barrier(3)

    def create(_: int) -> requests.Response:
        barrier.wait(timeout=60)
        return admin.send("POST", "/api/applications/", {"name": "raced"})

    with ThreadPoolExecutor(max_workers=3) as pool:
        responses = list(pool.map(create, range(3)))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [201, 409, 409], [r.text for r in responses]
    for response in responses:
        if response.status_code == 409:
            assert response.json()["error"]["code"] == "application_exists"
            assert "name" in response.json()["error"]["fields"]
    assert Application.objects.filter(name="raced").count() == 1


def test_a_role_change_is_audited_with_the_old_and_new_role(admin: Api) -> None:
    response = admin.send("PATCH", "/api/users/viewer/", {"role": "operator"})
    assert response.status_code == 200 and response.json()["role"] == "operator"
    entry = AuditEntry.objects.get(action="PATCH /api/users/{username}/", status_code=200)
    assert entry.actor_name == "admin"
    assert entry.detail == {"user": "viewer", "role": {"old": "viewer", "new": "operator"}}
