"""The served OpenAPI schema passes the tools users point at it: openapi-spec-validator accepts
it, openapi-python-client generates a client from it without dropping anything, and that
client, imported, reads and requests operations on a live server. Every operation says what
it does in its own words."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import OpenAPIV30SpecValidator
from rest_framework.test import APIClient

from controlplane.api.base import ApiView
from controlplane.api.operation_docs import DESCRIPTIONS
from controlplane.api.schema import JSON_VALUE, JSON_WITH_NUL
from tests.api.conftest import JOB_REFERENCE, Lineage

CLIENT = "epochal_client"


def operations(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        operation["operationId"]: operation
        for path in schema["paths"].values()
        for operation in path.values()
        if isinstance(operation, dict) and "operationId" in operation
    }


@pytest.fixture
def served_schema(client_for: Callable[[str | None], APIClient]) -> dict[str, Any]:
    answer = client_for("viewer").get("/api/schema/", {"format": "json"})
    assert answer.status_code == 200
    schema: dict[str, Any] = json.loads(answer.content)
    return schema


@pytest.fixture
def generated_client(served_schema: dict[str, Any], tmp_path: Path) -> Iterator[Any]:
    """openapi-python-client's package for the served schema, imported."""
    spec = tmp_path / "openapi.json"
    spec.write_text(json.dumps(served_schema))
    bin_dir = Path(sys.executable).parent
    generated = subprocess.run(
        [str(bin_dir / "openapi-python-client"), "generate", "--path", str(spec),
         "--meta", "none", "--output-path", str(tmp_path / CLIENT)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
    )  # fmt: skip
    output = generated.stdout + generated.stderr
    assert generated.returncode == 0, output
    # nothing dropped: no schema it could not parse, no endpoint left out, ruff ran on it
    assert "Warning" not in output and "Unable" not in output, output
    assert "Skipping Integration" not in output, output
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module(CLIENT)
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == CLIENT or m.startswith(CLIENT + ".")]:
            del sys.modules[name]


def test_the_spec_validator_accepts_the_schema(served_schema: dict[str, Any]) -> None:
    errors = [
        f"{'/'.join(map(str, e.path))}: {e.message}"
        for e in OpenAPIV30SpecValidator(served_schema).iter_errors()
    ]
    assert errors == []


def test_every_operation_has_its_own_description(served_schema: dict[str, Any]) -> None:
    described = {i: op.get("description", "") for i, op in operations(served_schema).items()}
    assert set(DESCRIPTIONS) <= set(described), "operation_docs.DESCRIPTIONS names no operation"
    for op_id, description in described.items():
        assert description.startswith(DESCRIPTIONS.get(op_id, "")), op_id
        assert len(description) > len("Needs the `viewer` role."), op_id  # says what it does
        assert description.endswith("role."), op_id  # and the role it needs
        assert (ApiView.__doc__ or "").strip() not in description, op_id
    assert len(set(described.values())) == len(described)
    users = operations(served_schema)["user_list_post"]["description"]
    assert users.endswith("Needs the `admin` role.")
    token = operations(served_schema)["token_list_post"]["description"]
    assert token.endswith("Needs the `viewer` role.")


def test_json_values_without_nul_are_what_the_schema_allows() -> None:
    """JsonValue, said without a union that refers to itself, still refuses NUL anywhere."""
    from openapi_schema_validator import OAS30Validator

    components = {"schemas": {"JsonValue": JSON_VALUE, "JsonWithNul": JSON_WITH_NUL}}
    validator = OAS30Validator({"$ref": "#/components/schemas/JsonValue", "components": components})
    for value in ("a", 1.5, True, None, [], {}, {"k": ["x", {"y": [1, None]}]}):
        assert validator.is_valid(value), value
    for value in ("a\x00", ["\x00"], {"k": [{"z": "b\x00"}]}, [[["\x00"]]]):
        assert not validator.is_valid(value), value


def test_a_generated_client_reads_and_requests_operations(
    generated_client: Any, live_server: Any, lineage: Lineage, tokens: dict[str, str]
) -> None:
    package = CLIENT
    client_module = importlib.import_module(f"{package}.client")
    models = importlib.import_module(f"{package}.models")
    job_detail = importlib.import_module(f"{package}.api.jobs.job_detail_get")
    request_op = importlib.import_module(f"{package}.api.operations.job_operation_request_post")
    fork_op = importlib.import_module(
        f"{package}.api.operations.application_operation_request_post"
    )
    cancel_op = importlib.import_module(f"{package}.api.operations.operation_cancel_post")
    new_version = importlib.import_module(f"{package}.api.applications.version_list_post")

    def client(role: str) -> Any:
        return client_module.AuthenticatedClient(
            base_url=live_server.url, token=tokens[role], prefix="Token"
        )

    # a read
    job = job_detail.sync(name=lineage.job.name, client=client("viewer"))
    assert isinstance(job, models.JobDetail)
    assert (job.name, job.application, job.parallelism) == ("clicks-main", "clicks", 2)

    # an operation on the job, and its cancellation
    savepoint = models.SavepointOperationRequest(
        kind=models.SavepointOperationRequestKind.SAVEPOINT, reason="generated client"
    )
    answer = request_op.sync_detailed(
        name=lineage.job.name, client=client("operator"), body=savepoint, idempotency_key="gc-1"
    )
    assert answer.status_code == 202, answer.content
    operation = answer.parsed
    assert isinstance(operation, models.Operation)
    assert (operation.kind.value, operation.state.value) == ("savepoint", "pending")
    cancelled = cancel_op.sync_detailed(operation_id=operation.id, client=client("operator"))
    assert cancelled.status_code in (200, 202), cancelled.content

    # the two endpoints whose bodies hold free JSON (a version's config, a fork's config)
    version = new_version.sync_detailed(
        name=lineage.application.name,
        client=client("admin"),
        body=models.VersionCreateRequest(
            job=models.VersionCreateRequestJob(JOB_REFERENCE),
            code_version="v2",
            config=models.VersionCreateRequestConfig.from_dict({"service_account": "spark-jobs"}),
        ),
    )
    assert version.status_code == 201, version.content
    assert (version.parsed.number, version.parsed.code_version) == (2, "v2")
    fork = fork_op.sync_detailed(
        name=lineage.application.name,
        client=client("operator"),
        body=models.ForkOperationRequest(
            kind=models.ForkOperationRequestKind.FORK,
            params=models.ForkOperationRequestParams(snapshot=lineage.main[2], branch="gc-fork"),
        ),
    )
    assert fork.status_code == 202, fork.content
    assert fork.parsed.kind.value == "fork" and fork.parsed.params["branch"] == "gc-fork"

    # a refusal comes back as the API's error, parsed
    refused = request_op.sync_detailed(
        name=lineage.job.name, client=client("viewer"), body=savepoint
    )
    assert refused.status_code == 403
    assert isinstance(refused.parsed, models.Error)
