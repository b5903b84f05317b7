"""Every failure has the shape ``{"error": {"code", "message", "fields", "detail"}}``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rest_framework.test import APIClient

from tests.api.conftest import Lineage

Client = Callable[[str | None], APIClient]


def error_of(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.content)
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"code", "message", "fields", "detail"}
    assert error["code"] == code
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["fields"], dict) and isinstance(error["detail"], dict)
    return error


def test_validation_errors_name_each_field(lineage: Lineage, client_for: Client) -> None:
    operator = client_for("operator")
    error = error_of(
        operator.post("/api/jobs/", {"name": "bad name!", "parallelism": 0}), 400, "invalid"
    )
    assert set(error["fields"]) == {"name", "application", "parallelism"}
    assert "name" in error["message"]
    error = error_of(
        operator.post("/api/jobs/clicks-main/operations/", {"kind": "rescale", "params": {}}),
        400,
        "invalid",
    )
    assert error["fields"] == {"parallelism": ["required"]}
    error = error_of(
        operator.post("/api/jobs/clicks-main/operations/", {"kind": "teleport"}), 400, "invalid"
    )
    assert "kind" in error["fields"]
    error_of(operator.get("/api/jobs/?limit=0"), 400, "invalid")
    error_of(operator.get("/api/jobs/?limit=abc"), 400, "invalid")
    error_of(operator.get("/api/jobs/?cursor=garbage"), 422, "invalid_cursor")
    error_of(
        operator.get("/api/applications/clicks/snapshots/?cursor=nonsense"), 422, "invalid_cursor"
    )
    error_of(operator.get("/api/applications/clicks/branches/?cursor=@@"), 422, "invalid_cursor")
    error_of(operator.get("/api/applications/clicks/lineage/?cursor=x1"), 422, "invalid_cursor")
    error_of(operator.get("/api/applications/clicks/snapshots/?first_parent=maybe"), 400, "invalid")


def test_malformed_json_and_wrong_media_type(lineage: Lineage, client_for: Client) -> None:
    operator = client_for("operator")
    error_of(
        operator.post("/api/jobs/", "{not json", content_type="application/json"),
        400,
        "malformed_request",
    )
    error_of(
        operator.post("/api/jobs/", "name=x", content_type="application/x-www-form-urlencoded"),
        415,
        "unsupported_media_type",
    )
    error_of(
        operator.post(
            "/api/jobs/clicks-main/operations/", "[1, 2]", content_type="application/json"
        ),
        400,
        "invalid",
    )


def test_auth_permission_not_found_and_method_errors(lineage: Lineage, client_for: Client) -> None:
    anonymous = client_for(None)
    response = anonymous.get("/api/jobs/")
    error_of(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"].startswith("Token")
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION="Token 0000")
    error_of(bad.get("/api/jobs/"), 401, "authentication_failed")
    error = error_of(client_for("viewer").post("/api/applications/", {}), 403, "permission_denied")
    assert "admin" in error["message"]

    viewer = client_for("viewer")
    error_of(viewer.get("/api/jobs/ghost/"), 404, "job_not_found")
    error_of(viewer.get("/api/applications/ghost/"), 404, "application_not_found")
    error_of(viewer.get("/api/applications/clicks/versions/9/"), 404, "version_not_found")
    error_of(viewer.get("/api/applications/clicks/snapshots/?rev=ghost"), 404, "unknown_revision")
    error_of(
        viewer.get("/api/applications/clicks/snapshots/" + "a" * 64 + "/"), 404, "unknown_revision"
    )
    error_of(viewer.get("/api/operations/not-a-uuid/"), 404, "operation_not_found")
    error_of(viewer.get("/api/nowhere/"), 404, "no_endpoint")
    error_of(client_for("admin").delete("/api/jobs/"), 405, "method_not_allowed")
    error_of(viewer.get("/api/jobs/", HTTP_ACCEPT="application/xml"), 406, "not_acceptable")


def test_conflicts_name_the_running_operation(lineage: Lineage, client_for: Client) -> None:
    operator = client_for("operator")
    first = operator.post("/api/jobs/clicks-main/operations/", {"kind": "stop"}).json()
    error = error_of(
        operator.post("/api/jobs/clicks-main/operations/", {"kind": "stop"}),
        409,
        "operation_in_progress",
    )
    assert first["id"] in error["message"]
    assert error["detail"]["operation"] == first["id"]
    assert error["detail"]["operation_url"] == first["url"]


def test_throttled_requests_get_429_with_retry_after(
    lineage: Lineage, client_for: Client, settings: Any
) -> None:
    from django.core.cache import cache

    cache.clear()
    settings.EPOCHAL_API_RATE = "3/min"
    viewer = client_for("viewer")
    statuses = [viewer.get("/api/jobs/").status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    response = viewer.get("/api/jobs/")
    error = error_of(response, 429, "throttled")
    assert int(response["Retry-After"]) > 0
    assert error["detail"]["retry_after_s"] > 0
    cache.clear()


def test_errors_say_what_is_expected(lineage: Lineage, client_for: Client) -> None:
    """A 401 names the header, a 415 the content type, an unknown kind the valid kinds, a
    revision past the root how far back the line goes."""
    anonymous = client_for(None)
    error = error_of(anonymous.get("/api/jobs/"), 401, "not_authenticated")
    assert "`Authorization: Token <token>`" in error["message"]
    bearer = APIClient()
    bearer.credentials(HTTP_AUTHORIZATION="Bearer not-a-token")
    error = error_of(bearer.get("/api/jobs/"), 401, "not_authenticated")
    assert "`Authorization: Token <token>`" in error["message"]
    error = error_of(anonymous.get("/metrics"), 401, "not_authenticated")
    assert "`Authorization: Bearer <token>`" in error["message"]

    operator = client_for("operator")
    url = "/api/jobs/clicks-main/operations/"
    refused = operator.post(url, data="kind=rescale", content_type="text/plain")
    error = error_of(refused, 415, "unsupported_media_type")
    assert '"text/plain"' in error["message"] and "application/json" in error["message"]

    error = error_of(operator.post(url, {"kind": "resize"}), 400, "invalid")
    assert error["fields"]["kind"] == [
        '"resize" is not an operation kind; the kinds are start, stop, savepoint, rescale, '
        "rollback, fork, migrate, align, hotswap"
    ]

    error = error_of(
        operator.post(url, {"kind": "rollback", "params": {"to": "main~1000"}}),
        422,
        "unknown_snapshot",
    )
    assert "goes back past the root: main~4 is the first commit of its line" in error["message"]
    assert lineage.repo.read_ref("heads/main").target == lineage.main[-1]  # nothing moved
    error = error_of(
        operator.get("/api/applications/clicks/snapshots/main~1000/"), 404, "unknown_revision"
    )
    assert "resolve 'main~1000'" in error["message"]
