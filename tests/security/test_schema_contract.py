"""What the served schema says is what the deployed server does: `?rev=` is checked against
its pattern, an empty `?rev=` or `?against=` is refused (not taken for the default), the
autoscaler PATCH declares every policy field with the bounds the server checks and
`max_parallelism` is bounded by the application's M; an operation request is a discriminated
`oneOf` per kind; and docs/api.md says what a reused idempotency key with another body gets."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from controlplane.autoscaler.decision import Policy
from controlplane.autoscaler.models import AutoscalePolicy
from controlplane.operations.params import PARAMS
from tests.security.deployed import APPLICATION, JOB, Deployment, api
from tests.security.servers import PROJECT_ROOT


@pytest.fixture(scope="module")
def base(deployment: Deployment) -> Iterator[str]:
    with deployment.serve() as url:
        yield url


@pytest.fixture(scope="module")
def schema(deployment: Deployment, base: str) -> dict[str, Any]:
    answer = api(base, deployment.tokens["viewer"], "GET", "/api/schema/?format=json")
    assert answer.status_code == 200
    return answer.json()  # type: ignore[no-any-return]


def _field_refused(answer: Any, field: str) -> None:
    assert answer.status_code == 400, answer.text
    assert field in answer.json()["error"]["fields"], answer.text


def test_revisions_in_query_parameters_are_checked(deployment: Deployment, base: str) -> None:
    viewer = deployment.tokens["viewer"]
    log = f"/api/applications/{APPLICATION}/snapshots/"
    for bad in ("", "../../etc", "main\n", "a b", "main..x"):
        _field_refused(api(base, viewer, "GET", log, params={"rev": bad}), "rev")
    for good in ("main", "heads/main", "tags/sp-1", deployment.main[0]):
        assert api(base, viewer, "GET", log, params={"rev": good}).status_code == 200, good
    diff = f"{log}{deployment.main[-1]}/diff/"
    for bad in ("", "main\n", "../x"):
        _field_refused(api(base, viewer, "GET", diff, params={"against": bad}), "against")
    assert api(base, viewer, "GET", diff, params={"against": "main~2"}).status_code == 200
    assert api(base, viewer, "GET", diff).status_code == 200


def test_the_autoscaler_patch_declares_the_policy_and_m_bounds_it(
    deployment: Deployment, base: str, schema: dict[str, Any]
) -> None:
    [body] = schema["paths"]["/api/jobs/{name}/autoscaler/"]["patch"]["requestBody"][
        "content"
    ].values()
    declared = body["schema"]
    assert declared["additionalProperties"] is False
    assert set(declared["properties"]) == set(AutoscalePolicy.FIELDS)
    # each declared bound is the one the server checks: the bound passes, one beyond does not
    for name, field in declared["properties"].items():
        for bound, beyond in (("minimum", -1), ("maximum", 1)):
            if bound not in field or name.endswith("parallelism"):
                continue
            step = 0.01 if field["type"] == "number" else 1
            assert not Policy(**{name: field[bound]}).problems(), (name, bound)
            assert Policy(**{name: field[bound] + beyond * step}).problems(), (name, bound)
    operator = deployment.tokens["operator"]
    path = f"/api/jobs/{JOB}/autoscaler/"
    _field_refused(
        api(base, operator, "PATCH", path, json={"max_parallelism": 99999}), "max_parallelism"
    )
    above_m = api(base, operator, "PATCH", path, json={"max_parallelism": 9})  # M = 8
    assert above_m.status_code == 422, above_m.text
    assert above_m.json()["error"]["fields"] == {
        "max_parallelism": ["at most 8 (the application's M)"]
    }
    crossed = api(base, operator, "PATCH", path, json={"min_parallelism": 8, "max_parallelism": 4})
    assert crossed.status_code == 422, crossed.text
    fine = api(base, operator, "PATCH", path, json={"max_parallelism": 8, "mode": "recommend"})
    assert fine.status_code == 200, fine.text
    assert fine.json()["policy"]["max_parallelism"] == 8
    _field_refused(api(base, operator, "PATCH", path, json={"surprise": 1}), "surprise")


def test_an_operation_request_is_a_discriminated_one_of_per_kind(schema: dict[str, Any]) -> None:
    request = schema["components"]["schemas"]["OperationRequestRequest"]
    assert request["discriminator"]["propertyName"] == "kind"
    assert set(request["discriminator"]["mapping"]) == set(PARAMS)
    assert len(request["oneOf"]) == len(PARAMS)


def test_the_docs_say_a_reused_key_with_another_body_is_422() -> None:
    text = (PROJECT_ROOT / "docs" / "api.md").read_text()
    paragraph = text.split("**Idempotency**", 1)[1].split("\n\n", 1)[0]
    assert "whatever its body" not in paragraph
    assert "422" in paragraph and "idempotency_key_reused" in paragraph
