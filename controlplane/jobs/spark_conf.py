"""Spark settings an operator may choose: resource keys with bounded values, nothing else.

Every other key — JVM options (`spark.driver.extraJavaOptions`), class paths, jars, files,
listeners, plugins — is code or a place, and only an admin's version sets it. An operator's
settings live on the job (`Job.spark_conf`) and override the version's for these keys only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from controlplane.errors import InvalidRequest

_INT: Final = re.compile(r"^[1-9][0-9]{0,6}$")
_MEMORY: Final = re.compile(r"^([1-9][0-9]{0,6})([mg])$")


@dataclass(frozen=True)
class Bound:
    """One allowed key: an integer count, or a memory size written ``<n>m`` / ``<n>g``."""

    kind: str  # "count" | "memory"
    low: int  # counts: the value; memory: MiB
    high: int

    def describe(self) -> str:
        if self.kind == "count":
            return f"an integer from {self.low} to {self.high}, as a string"
        return f'a size from {self.low}m to {self.high // 1024}g, e.g. "2g" or "512m"'

    def problem(self, value: object) -> str:
        """What is wrong with `value` ("" when it is allowed)."""
        if not isinstance(value, str):
            return f"must be a string: {self.describe()}"
        if self.kind == "count":
            if not _INT.match(value) or not self.low <= int(value) <= self.high:
                return f"must be {self.describe()}; got {value!r}"
            return ""
        match = _MEMORY.match(value)
        mib = 0 if match is None else int(match[1]) * (1024 if match[2] == "g" else 1)
        if match is None or not self.low <= mib <= self.high:
            return f"must be {self.describe()}; got {value!r}"
        return ""


#: the Spark settings an operator may give (a job's or a fork's `spark_conf`), with bounds
OPERATOR_SPARK_CONF: Final[Mapping[str, Bound]] = {
    "spark.executor.instances": Bound("count", 1, 256),
    "spark.executor.cores": Bound("count", 1, 64),
    "spark.executor.memory": Bound("memory", 512, 256 * 1024),
    "spark.driver.cores": Bound("count", 1, 32),
    "spark.driver.memory": Bound("memory", 512, 64 * 1024),
    "spark.sql.shuffle.partitions": Bound("count", 1, 100_000),
    "spark.default.parallelism": Bound("count", 1, 100_000),
}


def operator_spark_conf(value: Any, *, field: str = "spark_conf") -> dict[str, str]:
    """`value` when it is an object of allowed keys with values in bounds; InvalidRequest
    (400) naming every refused key (``spark_conf.<key>``) otherwise."""
    if not isinstance(value, Mapping):
        raise InvalidRequest(
            f"{field} must be an object of Spark settings",
            fields={field: ["must be a JSON object"]},
        )
    errors: dict[str, list[str]] = {}
    for key, item in value.items():
        bound = OPERATOR_SPARK_CONF.get(key)
        if bound is None:
            errors[f"{field}.{key}"] = [
                "not a setting an operator may choose (allowed: "
                f"{', '.join(sorted(OPERATOR_SPARK_CONF))}); JVM options, class paths, jars, "
                "files, listeners and every other key come only from an admin's version"
            ]
            continue
        problem = bound.problem(item)
        if problem:
            errors[f"{field}.{key}"] = [problem]
    if errors:
        keys = ", ".join(k.removeprefix(f"{field}.") for k in errors)
        raise InvalidRequest(f"{field}: refused {keys}", fields=errors, code="spark_conf_refused")
    return dict(value)
