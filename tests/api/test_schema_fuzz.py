"""Schemathesis fuzzes the served OpenAPI schema against a live server, as an admin, with every
check it has (server errors, status codes, content types, headers, response bodies, schema-valid
requests accepted, schema-invalid requests rejected, ignored auth, unsupported methods, …),
then follows the schema's links (create -> read, rotate, revoke, cancel, …).

At least 1,000 requests, 0 failures; the count is printed. The schema declares every bound and
enum the server enforces, so a valid request is never refused with a 400 and an invalid one
never accepted. Statuses a valid request may still get: 404 (what it names does not exist),
409 (it conflicts with the current state), 422 (well-formed but unusable: a cursor this API
did not issue, a weak password, a reused idempotency key).

Nothing is exempt: an operation request is one of the kinds, each with its own parameters
(required ones, bounds, patterns, no others); a job's `spark_conf` lists the allowed keys with
their bounds; every combination of the state query's parameters gets an answer (an epoch of a
snapshot's history, the caller's head epoch when `as_of_epoch` is absent) or a 422 when what it
names cannot be answered.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig

from tests.api.conftest import Lineage

POSITIVE_PER_OPERATION = 24
NEGATIVE_PER_OPERATION = 12
LINK_SCENARIOS = 6
AIMED_PER_OPERATION = 40
VALID_ALSO = ["2xx", "401", "403", "404", "409", "422"]
INVALID_ANSWERS = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422"]
CONFIG = SchemathesisConfig.from_dict(
    {
        "checks": {
            "positive_data_acceptance": {"expected-statuses": VALID_ALSO},
            "negative_data_rejection": {"expected-statuses": INVALID_ANSWERS},
        }
    }
)


def _on_the_lineage(lineage: Lineage) -> dict[str, dict[str, Any]]:
    """operationId -> what to put into its valid requests so that they reach the lineage's
    application and job (random names would mostly get 404 and never reach the checks of a
    kind's parameters, the spark_conf bounds or the state query's combinations)."""
    app, job = lineage.application.name, lineage.job.name
    # revisions that exist, where a kind names one (random ones would all be unknown: 422)
    revisions = {"fork": {"snapshot": lineage.main[-1]}, "rollback": {"to": lineage.main[1]}}
    return {
        "job_operation_request_post": {"path": {"name": job}, "params": revisions},
        "application_operation_request_post": {"path": {"name": app}, "params": revisions},
        "state_get": {"path": {"name": app}},
        "mapping_get": {"path": {"name": app}},
        # a job per branch: main has one already, so a request naming no branch takes another
        "job_list_post": {"body": {"application": app}, "absent": {"branch": "fuzzed"}},
    }


def _aimed(case: Any, aim: dict[str, Any]) -> Any:
    case.path_parameters = {**(case.path_parameters or {}), **aim.get("path", {})}
    if isinstance(case.body, dict):
        case.body = {**aim.get("absent", {}), **case.body, **aim.get("body", {})}
        params = case.body.get("params")
        names = aim.get("params", {}).get(case.body.get("kind"), {})
        if isinstance(params, dict):
            case.body["params"] = {**params, **{k: v for k, v in names.items() if k in params}}
    return case


def _free_the_job(response: Any, call_raw: Any) -> None:
    """Cancel an accepted operation, so that the job takes the next request (one active
    operation per job)."""
    body = response.json() if response.status_code == 202 else None
    if isinstance(body, dict) and "phases" in body:  # an operation, not a pending state answer
        call_raw("POST", f"/api/operations/{body['id']}/cancel/")


def _resolve(expression: str, case: Any, body: Any) -> Any:
    """An OpenAPI runtime expression: `$response.body#/x` or `$request.path.x`."""
    if expression.startswith("$response.body#/"):
        return body[expression.removeprefix("$response.body#/")]
    return case.path_parameters[expression.removeprefix("$request.path.")]


def _scenario(source: Any, targets: list[Any], status: str, call: Any, calls: list[int]) -> Any:
    """Valid requests to `source`; each answer with `status` followed to every link target."""

    @given(case=source.as_strategy(generation_mode=GenerationMode.POSITIVE))
    @settings(
        max_examples=LINK_SCENARIOS,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def scenario(case: Any) -> None:
        response = call(case)
        calls.append(1)
        case.validate_response(response)
        if str(response.status_code) != status:
            return
        for target, parameters in targets:
            follow = find(
                target.as_strategy(generation_mode=GenerationMode.POSITIVE),
                lambda _: True,
                settings=settings(database=None, phases=[Phase.generate]),
            )
            follow.path_parameters = {
                **(follow.path_parameters or {}),
                **{
                    name: _resolve(expression, case, response.json())
                    for name, expression in parameters.items()
                },
            }
            answer = call(follow)
            calls.append(1)
            follow.validate_response(answer)

    return scenario


def _follow_links(schema: Any, raw: dict[str, Any], call: Any) -> int:
    """Stateful: for every link the schema declares, create with valid requests and follow each
    answer that matches the link to its target (read, rotate, revoke, cancel, …), every check
    on both. Followed deterministically (the server's state moves on between scenarios, so
    Hypothesis's state machines could not replay one)."""
    calls: list[int] = []
    for methods in raw["paths"].values():
        for definition in methods.values():
            for status, answer in definition["responses"].items():
                links = answer.get("links", {})
                if not links:
                    continue
                source = schema.find_operation_by_id(definition["operationId"])
                targets = [
                    (schema.find_operation_by_id(link["operationId"]), link["parameters"])
                    for link in links.values()
                ]
                _scenario(source, targets, status, call, calls)()
    return len(calls)


#: how every fuzzing run draws its cases: reproducible, no example database, no deadline
_RUN: dict[str, Any] = {
    "deadline": None,
    "database": None,
    "derandomize": True,
    "phases": [Phase.explicit, Phase.generate],
    "suppress_health_check": list(HealthCheck),
}


def _fuzz(operation: Any, mode: GenerationMode, examples: int, call: Any) -> int:
    calls = 0

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=examples, **_RUN)
    def run(case: Any) -> None:
        nonlocal calls
        response = call(case)
        calls += 1
        case.validate_response(response)

    try:
        run()
    except Unsatisfiable:
        # Nothing can be made invalid (an operation without parameters or body).
        assert mode is GenerationMode.NEGATIVE and calls == 0
    return calls


def _fuzz_aimed(
    operation: Any, aim: dict[str, Any], examples: int, call: Any, call_raw: Any
) -> int:
    """Valid requests aimed at the lineage, every check."""
    calls = 0

    @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
    @settings(max_examples=examples, **_RUN)
    def run(case: Any) -> None:
        nonlocal calls
        response = call(_aimed(case, aim))
        calls += 1
        case.validate_response(response)
        _free_the_job(response, call_raw)

    run()
    return calls


@pytest.mark.timeout(1500)
def test_every_operation_survives_fuzzing_with_every_check_and_stateful_links(
    live_server: Any, lineage: Lineage, tokens: dict[str, str]
) -> None:
    session = requests.Session()
    session.headers["Authorization"] = f"Token {tokens['admin']}"
    # One connection per request: no server thread (and database session) outlives the test.
    session.headers["Connection"] = "close"
    raw = session.get(f"{live_server.url}/api/schema/", params={"format": "json"}, timeout=60)
    assert raw.status_code == 200
    schema = schemathesis.openapi.from_dict(raw.json(), config=CONFIG)
    base_url = live_server.url

    def call(case: Any) -> Any:
        # Longer than the longest wait a request may ask for (a state query's `timeout`, at
        # most 30 s: the server waits that long for an epoch not yet committed).
        return case.call(base_url=base_url, session=session, timeout=60)

    started = time.monotonic()

    def call_raw(method: str, path: str) -> Any:
        return session.request(method, f"{base_url}{path}", timeout=60)

    aimed = 0
    statuses: dict[str, set[int]] = {}
    for operation_id, aim in _on_the_lineage(lineage).items():
        operation = schema.find_operation_by_id(operation_id)
        answered: set[int] = set()

        def noting(case: Any, answered: set[int] = answered) -> Any:
            response = call(case)
            answered.add(response.status_code)
            return response

        aimed += _fuzz_aimed(operation, aim, AIMED_PER_OPERATION, noting, call_raw)
        statuses[operation_id] = answered
    # The aimed requests got past the lookups: each endpoint accepted some of them.
    for operation_id, answered in statuses.items():
        assert answered & {200, 201, 202}, (operation_id, answered)

    counts: dict[str, int] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        counts[operation.label] = _fuzz(
            operation, GenerationMode.POSITIVE, POSITIVE_PER_OPERATION, call
        ) + _fuzz(operation, GenerationMode.NEGATIVE, NEGATIVE_PER_OPERATION, call)

    link_calls = _follow_links(schema, raw.json(), call)
    session.close()
    total = sum(counts.values()) + aimed + link_calls
    seconds = time.monotonic() - started
    print(
        f"fuzzed {len(counts)} operations with every check: {total} requests "
        f"({aimed} aimed at a lineage, {link_calls} following links) in {seconds:.0f}s, "
        "0 failures"
    )
    assert len(counts) >= 35
    assert link_calls > 0
    assert total >= 1000, counts
