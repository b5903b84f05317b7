"""Every refusal of a signed-in user that the docs list is an audit row naming the user, the
route, the status and the fields — through the deployed server: a viewer's 403 on a dashboard
action, the operator forms' 400s (a store nobody registered, a function that is code, a NUL
in a savepoint name, a rescale past M), an API 413, a NUL in the path, and reads answered 404
or 422. The same refusals without credentials are counted, not written."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.security.deployed import JOB, Deployment, api, signed_in


@pytest.fixture(scope="module")
def base(deployment: Deployment) -> Iterator[str]:
    with deployment.serve() as url:
        yield url


def _rows(deployment: Deployment, user: str, target: str, status: int) -> list[dict[str, object]]:
    return deployment.audit(
        "u.username = ? AND a.target = ? AND a.status_code = ?", user, target, status
    )


def test_dashboard_refusals_are_audited(deployment: Deployment, base: str) -> None:
    viewer = signed_in(base, "viewer", deployment.password("viewer"))
    stop = f"/jobs/{JOB}/stop/"
    assert viewer.post(f"{base}{stop}", data={}, timeout=60).status_code == 403
    [row] = _rows(deployment, "viewer", stop, 403)
    assert row["outcome"] == "forbidden" and row["source"] == "web"
    assert row["action"] == "POST /jobs/{name}/{kind}/"

    operator = signed_in(base, "operator", deployment.password("operator"))
    migrate = f"/jobs/{JOB}/migrate/"
    for data, field in (
        ({"mode": "copy", "store": "file:///etc"}, "store"),
        ({"mode": "transform", "function": "os:system"}, "function"),
    ):
        answer = operator.post(f"{base}{migrate}", data=data, timeout=60)
        assert answer.status_code == 400, answer.text[:300]
        assert field in _rows(deployment, "operator", migrate, 400)[-1]["detail"]["fields"]
    savepoint = f"/jobs/{JOB}/savepoint/"
    answer = operator.post(f"{base}{savepoint}", data={"name": "a\x00b"}, timeout=60)
    assert answer.status_code == 400
    assert _rows(deployment, "operator", savepoint, 400)[-1]["detail"]["fields"] == ["name"]
    rescale = f"/jobs/{JOB}/rescale/"
    answer = operator.post(f"{base}{rescale}", data={"parallelism": 99, "mode": "restart"})
    assert answer.status_code in (400, 409, 422), answer.status_code
    assert (
        len(deployment.audit("u.username = 'operator' AND a.action LIKE 'web rescale%'"))
        + len(_rows(deployment, "operator", rescale, answer.status_code))
        == 1
    )


def test_api_refusals_before_and_after_the_views_are_audited(
    deployment: Deployment, base: str
) -> None:
    operator = deployment.tokens["operator"]
    big = api(
        base,
        operator,
        "POST",
        "/api/jobs/",
        data=b"{" + b" " * (1024 * 1024 + 10) + b"}",
        headers={"Content-Type": "application/json"},
    )
    assert big.status_code == 413
    [row] = _rows(deployment, "operator", "/api/jobs/", 413)
    assert row["detail"]["code"] == "body_too_large" and row["detail"]["fields"] == ["body"]

    assert api(base, operator, "GET", "/api/jobs/a%00b/").status_code == 400
    [row] = _rows(deployment, "operator", "/api/jobs/a%00b/", 400)
    assert row["detail"]["fields"] == ["path"]

    assert api(base, operator, "GET", "/api/jobs/ghost/").status_code == 404
    assert _rows(deployment, "operator", "/api/jobs/ghost/", 404)
    assert api(base, operator, "GET", "/api/jobs/", params={"cursor": "x"}).status_code == 422
    [row] = _rows(deployment, "operator", "/api/jobs/", 422)
    assert row["detail"]["code"] == "invalid_cursor"


def test_anonymous_refusals_are_counted_not_written(deployment: Deployment, base: str) -> None:
    before = len(deployment.audit())
    assert api(base, None, "GET", "/api/jobs/a%00b/").status_code == 400
    big = api(base, None, "POST", "/api/jobs/", data=b"x" * (1024 * 1024 + 1))
    assert big.status_code == 413
    assert api(base, None, "GET", "/api/jobs/ghost/").status_code == 401
    assert len(deployment.audit()) == before
