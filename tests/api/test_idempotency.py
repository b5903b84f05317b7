"""`Idempotency-Key`: the first request creates (202), repeats return the same operation (200)."""

from __future__ import annotations

from collections.abc import Callable

from rest_framework.test import APIClient

from controlplane.operations.models import Operation
from tests.api.conftest import Lineage

Client = Callable[[str | None], APIClient]
OPS = "/api/jobs/clicks-main/operations/"


def test_a_repeated_key_returns_the_same_operation_with_200(
    lineage: Lineage, client_for: Client
) -> None:
    operator = client_for("operator")
    first = operator.post(OPS, {"kind": "stop"}, HTTP_IDEMPOTENCY_KEY="stop-1")
    assert first.status_code == 202
    assert "Idempotent-Replayed" not in first
    for _ in range(3):
        again = operator.post(OPS, {"kind": "stop"}, HTTP_IDEMPOTENCY_KEY="stop-1")
        assert again.status_code == 200
        assert again["Idempotent-Replayed"] == "true"
        assert again["Location"] == first["Location"]
        assert again.json()["id"] == first.json()["id"]
    assert Operation.objects.count() == 1


def test_a_replay_returns_the_operation_even_after_it_ended(
    lineage: Lineage, client_for: Client
) -> None:
    operator = client_for("operator")
    first = operator.post(OPS, {"kind": "stop"}, HTTP_IDEMPOTENCY_KEY="k").json()
    operator.post(f"{first['url']}cancel/")
    again = operator.post(OPS, {"kind": "stop"}, HTTP_IDEMPOTENCY_KEY="k")
    assert again.status_code == 200
    assert again.json()["id"] == first["id"] and again.json()["state"] == "cancelled"
    fresh = operator.post(OPS, {"kind": "stop"}, HTTP_IDEMPOTENCY_KEY="k2")
    assert fresh.status_code == 202 and fresh.json()["id"] != first["id"]


def test_keys_belong_to_their_user(lineage: Lineage, client_for: Client) -> None:
    mine = client_for("operator").post(OPS, {"kind": "stop"}, HTTP_IDEMPOTENCY_KEY="same")
    theirs = client_for("admin").post(OPS, {"kind": "stop"}, HTTP_IDEMPOTENCY_KEY="same")
    assert mine.status_code == 202
    assert theirs.status_code == 409  # a new request of another user: the job is busy
    assert theirs.json()["error"]["detail"]["operation"] == mine.json()["id"]


def test_without_a_key_every_request_is_new(lineage: Lineage, client_for: Client) -> None:
    operator = client_for("operator")
    assert operator.post(OPS, {"kind": "stop"}).status_code == 202
    assert operator.post(OPS, {"kind": "stop"}).status_code == 409


def test_an_overlong_key_is_a_field_error(lineage: Lineage, client_for: Client) -> None:
    response = client_for("operator").post(OPS, {"kind": "stop"}, HTTP_IDEMPOTENCY_KEY="k" * 201)
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {"idempotency_key": ["at most 200 characters"]}
