"""An Idempotency-Key is bound to the user, method, path and body that first used it (Stripe's
rule): the same request again replays the first answer; a different request with the same key
gets 422 naming the key, and creates nothing. Through a live server."""

from __future__ import annotations

from typing import Any

import pytest
import requests

from controlplane.audit.models import AuditEntry
from controlplane.operations.models import Operation
from tests.api.conftest import Lineage

pytestmark = pytest.mark.django_db(transaction=True)


def post(base: str, token: str, path: str, body: dict[str, Any], key: str) -> requests.Response:
    return requests.post(
        f"{base}{path}",
        json=body,
        headers={"Authorization": f"Token {token}", "Idempotency-Key": key, "Connection": "close"},
        timeout=120,
    )


def test_same_key_replays_the_same_request_and_refuses_another(
    live_server: Any, lineage: Lineage, tokens: dict[str, str]
) -> None:
    base, token = live_server.url, tokens["operator"]
    path = "/api/jobs/clicks-main/operations/"
    first = post(base, token, path, {"kind": "savepoint", "reason": "nightly"}, "k-1")
    assert first.status_code == 202, first.text
    # The same request (key order and spacing do not matter): the same operation.
    again = post(base, token, path, {"reason": "nightly", "kind": "savepoint"}, "k-1")
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]

    other_body = post(base, token, path, {"kind": "savepoint", "reason": "other"}, "k-1")
    other_path = post(
        base, token, "/api/applications/clicks/operations/", {"kind": "savepoint"}, "k-1"
    )
    for response in (other_body, other_path):
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["code"] == "idempotency_key_reused"
        assert "Idempotency-Key" in error["fields"]
        assert error["detail"]["operation"] == first.json()["id"]
    assert Operation.objects.count() == 1
    refusals = AuditEntry.objects.filter(status_code=422, actor_name="operator")
    assert refusals.count() == 2
    assert all(e.detail["code"] == "idempotency_key_reused" for e in refusals)

    # Keys are per user: another user's same key is their own request.
    mine = post(base, tokens["admin"], path, {"kind": "savepoint", "reason": "other"}, "k-1")
    assert mine.status_code in (202, 409), mine.text
    assert mine.json().get("error", {}).get("code") != "idempotency_key_reused"
