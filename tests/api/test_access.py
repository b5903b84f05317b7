"""Every URL under /api/ and /metrics refuses anonymous (401) and under-privileged (403) access.

The URL patterns are enumerated from the resolver, so a new endpoint is covered the moment it
is routed (and this test fails until its path parameters can be filled in below).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

from controlplane.accounts.selectors import user_get
from controlplane.accounts.tokens import token_create
from controlplane.operations.services import operation_request
from tests.api.conftest import Lineage

Client = Callable[[str | None], APIClient]
METHODS = ("get", "post", "put", "patch", "delete")
UNSAFE = ("post", "put", "patch", "delete")
# The role each implemented method needs, by route; anything not listed needs viewer.
ADMIN_ONLY = {"api/users/", "api/users/<str:username>/"}
# Everyone manages their own API tokens (and only admins anyone's: tests/security/test_tokens.py).
SELF_SERVICE = {"api/tokens/", "api/tokens/<int:token_id>/", "api/tokens/<int:token_id>/rotate/"}
OPERATOR_WRITES = {
    "api/jobs/",
    "api/jobs/<str:name>/operations/",
    "api/jobs/<str:name>/autoscaler/",
    "api/jobs/<str:name>/savepoint-schedule/",
    "api/applications/<str:name>/operations/",
    "api/operations/<str:operation_id>/cancel/",
}


def _routes(patterns: list[Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from _routes(pattern.url_patterns, route)
        elif isinstance(pattern, URLPattern):
            yield route, pattern.callback


def api_routes() -> list[tuple[str, Any]]:
    found = [
        (route, view)
        for route, view in _routes(get_resolver().url_patterns)
        if route.startswith(("api/", "^[\\s\\S]*$")) or route == "metrics"
    ]
    found = [(r.replace("api/^[\\s\\S]*$", "api/<unknown>"), v) for r, v in found]
    return found


def concrete(route: str, values: dict[str, str]) -> str:
    path = route
    if route == "api/<unknown>":
        return "/api/no/such/endpoint/"
    for name in re.findall(r"<(?:\w+:)?(\w+)>", route):
        key = f"{route.split('/')[1]}.{name}"
        if key not in values and name not in values:
            raise AssertionError(f"teach test_access how to fill <{name}> in {route}")
        path = re.sub(rf"<(?:\w+:)?{name}>", values.get(key, values.get(name, "")), path, count=1)
    return "/" + path


def implemented(view: Any) -> set[str]:
    cls = getattr(view, "view_class", None) or getattr(view, "cls", None)
    assert cls is not None, f"{view} is not a class-based view"
    return {m for m in METHODS if hasattr(cls, m)}


@pytest.fixture
def values(lineage: Lineage) -> dict[str, str]:
    op = operation_request(kind="stop", application=lineage.application, job=lineage.job)
    return {
        "applications.name": "clicks",
        "jobs.name": "clicks-main",
        "number": "1",
        "snapshot_id": lineage.main[1],
        "operation_id": str(op.operation.pk),
        "username": "viewer",
        "token_id": str(token_create(user=user_get(username="viewer")).token.pk),
    }


def test_every_route_is_enumerated() -> None:
    routes = {route for route, _ in api_routes()}
    assert len(routes) >= 25
    assert {"metrics", "api/schema/", "api/docs/", "api/<unknown>"} <= routes


def test_anonymous_requests_are_refused_with_401_everywhere(
    values: dict[str, str], client_for: Client
) -> None:
    anonymous = client_for(None)
    for route, _ in api_routes():
        path = concrete(route, values)
        for method in METHODS:
            response = getattr(anonymous, method)(path)
            assert response.status_code == 401, (method, path, response.content)
            if route != "metrics" and response["Content-Type"].startswith("application/json"):
                assert response.json()["error"]["code"] == "not_authenticated"


def test_bad_tokens_are_refused_with_401(values: dict[str, str]) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    for route, _ in api_routes():
        response = client.get(concrete(route, values))
        assert response.status_code == 401, route


def test_under_privileged_users_are_refused_with_403(
    values: dict[str, str], client_for: Client
) -> None:
    viewer, operator = client_for("viewer"), client_for("operator")
    checked = 0
    for route, view in api_routes():
        if route == "api/<unknown>" or route in SELF_SERVICE:
            continue
        path = concrete(route, values)
        methods = implemented(view)
        for method in sorted(methods & set(UNSAFE)):
            response = getattr(viewer, method)(path, {})
            assert response.status_code == 403, (method, path, response.content)
            assert response.json()["error"]["code"] == "permission_denied"
            checked += 1
            if route not in OPERATOR_WRITES:
                assert getattr(operator, method)(path, {}).status_code == 403, (method, path)
        if route in ADMIN_ONLY and "get" in methods:
            assert viewer.get(path).status_code == 403, path
            assert operator.get(path).status_code == 403, path
            checked += 1
    assert checked >= 10


def test_viewers_can_read_everything_but_users(values: dict[str, str], client_for: Client) -> None:
    viewer = client_for("viewer")
    for route, view in api_routes():
        if route in ADMIN_ONLY or route == "api/<unknown>" or "get" not in implemented(view):
            continue
        path = concrete(route, values)
        response = viewer.get(path)
        assert response.status_code == 200, (path, response.content[:300])
