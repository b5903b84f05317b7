"""A JSON key given twice in one object is refused (400 naming the key), through the deployed
server: with "the last one wins", `{"kind": "stop", "kind": "rescale", …}` ran a rescale, and
a forbidden Spark setting in a first `spark_conf` disappeared behind a second one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.security.deployed import APPLICATION, JOB, Deployment, api


@pytest.fixture(scope="module")
def base(deployment: Deployment) -> Iterator[str]:
    with deployment.serve() as url:
        yield url


def _post(base: str, token: str, path: str, raw: bytes) -> dict[str, object]:
    answer = api(base, token, "POST", path, data=raw, headers={"Content-Type": "application/json"})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "malformed_request", error
    return error


def test_duplicate_keys_are_a_400_naming_the_key(deployment: Deployment, base: str) -> None:
    operator, viewer = deployment.tokens["operator"], deployment.tokens["viewer"]
    kind = _post(
        base,
        operator,
        f"/api/jobs/{JOB}/operations/",
        b'{"kind": "stop", "kind": "rescale", "params": {"parallelism": 2}}',
    )
    assert kind["fields"] == {"kind": ["given more than once"]}, kind
    assert "kind" in str(kind["message"])
    conf = _post(
        base,
        operator,
        "/api/jobs/",
        b'{"name": "dup", "application": "' + APPLICATION.encode() + b'", '
        b'"spark_conf": {"spark.driver.extraJavaOptions": "-Dx=1"}, '
        b'"spark_conf": {"spark.driver.memory": "1g"}}',
    )
    assert list(conf["fields"]) == ["spark_conf"], conf
    nested = _post(
        base,
        operator,
        "/api/jobs/",
        b'{"name": "dup", "application": "' + APPLICATION.encode() + b'", '
        b'"spark_conf": {"spark.driver.memory": "1g", "spark.driver.memory": "2g"}}',
    )
    assert list(nested["fields"]) == ["spark.driver.memory"], nested
    # nothing happened
    assert api(base, viewer, "GET", "/api/operations/").json()["results"] == []
    jobs = api(base, viewer, "GET", "/api/jobs/").json()["results"]
    assert [j["name"] for j in jobs] == [JOB]
