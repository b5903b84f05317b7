"""Schemathesis fuzzes every operation of the OpenAPI schema (>= 1000 generated requests, as
an admin, against a live server): no 5xx, and every response conforms to the schema (status
code declared, content type, headers, body shape).

Positive cases (valid by the schema) are checked for full conformance; negative cases
(invalid by the schema) only for "no server error" and a declared status code.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.api.conftest import Lineage

POSITIVE_PER_OPERATION = 32
NEGATIVE_PER_OPERATION = 10
FULL_CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
NEGATIVE_CHECKS = [not_a_server_error, status_code_conformance]


def _fuzz(
    operation: Any,
    mode: GenerationMode,
    examples: int,
    base_url: str,
    session: requests.Session,
    checks: list[Any],
) -> int:
    calls = 0

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        nonlocal calls
        response = case.call(base_url=base_url, session=session)
        calls += 1
        case.validate_response(response, checks=checks)

    try:
        run()
    except Unsatisfiable:
        # Nothing can be made invalid (an operation without parameters or body).
        assert mode is GenerationMode.NEGATIVE and calls == 0
    return calls


@pytest.mark.timeout(900)
def test_every_operation_survives_fuzzing_and_answers_as_the_schema_says(
    live_server: Any, lineage: Lineage, tokens: dict[str, str]
) -> None:
    session = requests.Session()
    session.headers["Authorization"] = f"Token {tokens['admin']}"
    # One connection per request: no server thread (and database session) outlives the test.
    session.headers["Connection"] = "close"
    raw = session.get(f"{live_server.url}/api/schema/", params={"format": "json"}, timeout=60)
    assert raw.status_code == 200
    schema = schemathesis.openapi.from_dict(raw.json())
    base_url = live_server.url
    started = time.monotonic()
    counts: dict[str, int] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        positive = _fuzz(
            operation,
            GenerationMode.POSITIVE,
            POSITIVE_PER_OPERATION,
            base_url,
            session,
            FULL_CHECKS,
        )
        negative = _fuzz(
            operation,
            GenerationMode.NEGATIVE,
            NEGATIVE_PER_OPERATION,
            base_url,
            session,
            NEGATIVE_CHECKS,
        )
        counts[operation.label] = positive + negative
    total = sum(counts.values())
    session.close()
    seconds = time.monotonic() - started
    print(f"fuzzed {len(counts)} operations with {total} requests in {seconds:.0f}s")
    assert len(counts) >= 27
    assert total >= 1000, counts
