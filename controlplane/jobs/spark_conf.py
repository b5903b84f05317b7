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
from snapshots_store.patterns import whole_match

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

    def pattern(self) -> str:
        """The values allowed, as one regular expression (what the OpenAPI schema says)."""
        if self.kind == "count":
            return f"^({integer_range_pattern(self.low, self.high)})$"
        mib = integer_range_pattern(self.low, self.high)
        gib = integer_range_pattern(-(-self.low // 1024), self.high // 1024)
        return f"^(({mib})m|({gib})g)$"

    def problem(self, value: object) -> str:
        """What is wrong with `value` ("" when it is allowed)."""
        if not isinstance(value, str):
            return f"must be a string: {self.describe()}"
        if self.kind == "count":
            if whole_match(_INT, value) is None or not self.low <= int(value) <= self.high:
                return f"must be {self.describe()}; got {value!r}"
            return ""
        match = whole_match(_MEMORY, value)
        mib = 0 if match is None else int(match[1]) * (1024 if match[2] == "g" else 1)
        if match is None or not self.low <= mib <= self.high:
            return f"must be {self.describe()}; got {value!r}"
        return ""


def integer_range_pattern(low: int, high: int) -> str:
    """A regular expression (no anchors) matching the decimal integers ``low..high``, without
    leading zeros: ``integer_range_pattern(1, 256)`` -> ``[1-9]|[1-9][0-9]|1[0-9][0-9]|…``."""
    pieces: list[str] = []
    for digits in range(len(str(low)), len(str(high)) + 1):
        a = max(low, 10 ** (digits - 1) if digits > 1 else 0)
        b = min(high, 10**digits - 1)
        if a <= b:
            pieces += _same_length(str(a), str(b))
    return "|".join(pieces)


def _same_length(a: str, b: str) -> list[str]:
    """Patterns for the integers from `a` to `b`, both written with the same number of digits."""
    if a == b:
        return [a]
    if set(a) == {"0"} and set(b) == {"9"}:
        return [f"[0-9]{{{len(a)}}}"]
    if len(a) == 1:
        return [f"[{a}-{b}]"]
    if a[0] == b[0]:
        return [a[0] + rest for rest in _same_length(a[1:], b[1:])]
    n = len(a) - 1
    out = [a[0] + rest for rest in _same_length(a[1:], "9" * n)]
    if int(a[0]) + 1 <= int(b[0]) - 1:
        out.append(f"[{int(a[0]) + 1}-{int(b[0]) - 1}][0-9]{{{n}}}")
    out += [b[0] + rest for rest in _same_length("0" * n, b[1:])]
    return out


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


def spark_conf_schema() -> dict[str, Any]:
    """The JSON schema of an operator's `spark_conf`: the allowed keys, each value a string
    within its bounds, nothing else (the OpenAPI schema and the request checks use it)."""
    return {
        "type": "object",
        "description": "Spark resource settings over the version's; any other key is a 400 "
        "naming it (docs/security.md#spark-settings-an-operator-may-choose).",
        "properties": {
            key: {"type": "string", "pattern": bound.pattern(), "description": bound.describe()}
            for key, bound in OPERATOR_SPARK_CONF.items()
        },
        "additionalProperties": False,
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
