"""The schemas the OpenAPI document publishes are the ones the server checks: a job's
`spark_conf` patterns accept exactly the values the bounds do, and an operation's parameters
are refused by their kind's schema with a 400 naming each field."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from rest_framework.test import APIClient

from controlplane.errors import InvalidRequest
from controlplane.jobs.spark_conf import OPERATOR_SPARK_CONF, spark_conf_schema
from controlplane.operations.params import check_params
from tests.api.conftest import Lineage


@pytest.mark.parametrize("key", sorted(OPERATOR_SPARK_CONF))
def test_the_spark_conf_pattern_accepts_exactly_what_the_bounds_accept(key: str) -> None:
    bound = OPERATOR_SPARK_CONF[key]
    pattern = re.compile(spark_conf_schema()["properties"][key]["pattern"])
    values = [str(n) for n in range(0, 1200)] + [str(n) for n in range(99_990, 100_010)]
    values += [f"{n}m" for n in range(0, 270_000, 11)] + [f"{n}g" for n in range(0, 300)]
    values += ["511m", "512m", "64g", "65g", "256g", "257g", "0", "01", "1.5", "2G", "-1", ""]
    accepted = {v for v in values if pattern.fullmatch(v)}
    allowed = {v for v in values if not bound.problem(v)}
    assert accepted == allowed
    assert allowed  # each key allows some of them


def _refused(kind: str, params: object) -> dict[str, list[str]]:
    with pytest.raises(InvalidRequest) as refused:
        check_params(kind, params)
    return refused.value.fields


def test_each_kind_refuses_what_its_schema_does_not_take_naming_the_field() -> None:
    assert _refused("rescale", {}) == {"parallelism": ["required"]}
    assert set(_refused("rescale", {"parallelism": "3", "speed": 1})) == {"parallelism", "speed"}
    assert set(_refused("stop", {"stop_deadline_s": 86401})) == {"stop_deadline_s"}
    assert set(_refused("fork", {"snapshot": "main~1", "branch": "../../etc"})) == {"branch"}
    conf = {"snapshot": "main", "branch": "b", "spark_conf": {"spark.jars": "x"}}
    assert set(_refused("fork", conf)) == {"spark_conf.spark.jars"}
    assert set(_refused("migrate", {"mode": "copy", "store_url": "file:///etc"})) == {
        "store",
        "store_url",
    }
    assert set(_refused("migrate", {"mode": "teleport"})) == {"mode"}
    assert set(_refused("migrate", {"mode": "transform", "function": "a:b"})) == {"function"}
    check_params("migrate", {"mode": "rehash", "max_parallelism": 16})
    check_params("rollback", {"to": "main~2"})
    check_params("fork", {"snapshot": "tags/sp-1^2", "branch": "exp/b", "spark_conf": {}})


@pytest.mark.django_db
def test_a_revision_with_a_newline_an_arabic_digit_or_an_absurd_count_is_a_400(
    lineage: Lineage, client_for: Callable[[str | None], APIClient]
) -> None:
    """Git's revision syntax over REST: the refusals name the field; nothing is requested
    or moved; ``X^0`` is X."""
    operator = client_for("operator")
    url = "/api/jobs/clicks-main/operations/"
    for to in ["main~1\n", "main~\u0663", "main~99999999999", "main~" + "9" * 5000]:
        response = operator.post(url, {"kind": "rollback", "params": {"to": to}})
        assert response.status_code == 400, (to, response.status_code)
        assert "to" in response.json()["error"]["fields"], response.json()
    assert lineage.repo.read_ref("heads/main").target == lineage.main[-1]
    against = operator.get(
        f"/api/applications/clicks/snapshots/{lineage.main[2]}/diff/", {"against": "main~1\n"}
    )
    assert against.status_code == 400 and "against" in against.json()["error"]["fields"]
    same = operator.get(
        f"/api/applications/clicks/snapshots/{lineage.main[2]}/diff/", {"against": "tags/sp-1^0"}
    )
    assert same.status_code == 200, same.content
    assert (
        operator.get("/api/applications/clicks/snapshots/main~2^0/").json()["snapshot_id"]
        == (lineage.main[2])
    )
