"""The schemas the OpenAPI document publishes are the ones the server checks: a job's
`spark_conf` patterns accept exactly the values the bounds do, and an operation's parameters
are refused by their kind's schema with a 400 naming each field."""

from __future__ import annotations

import re

import pytest

from controlplane.errors import InvalidRequest
from controlplane.jobs.spark_conf import OPERATOR_SPARK_CONF, spark_conf_schema
from controlplane.operations.params import check_params


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
