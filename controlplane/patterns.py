"""The whole-string pattern checks of Django fields, DRF serializers and JSON schemas, all
through `snapshots_store.patterns.whole_match` (``$`` in ``re.search`` lets a trailing
newline through: ``"main\\n"`` for ``^[A-Za-z0-9]…$``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.utils.deconstruct import deconstructible
from jsonschema import Draft4Validator, validators
from jsonschema.exceptions import ValidationError as SchemaError
from rest_framework import serializers

from snapshots_store.patterns import whole_match


@deconstructible(path="controlplane.patterns.WholeRegexValidator")
class WholeRegexValidator(RegexValidator):
    """Django's `RegexValidator`, matching the whole value (drf-spectacular publishes its
    pattern, DRF's model serializers copy it from the model field)."""

    def __call__(self, value: Any) -> None:
        matched = whole_match(self.regex, str(value)) is not None
        if matched == self.inverse_match:
            raise ValidationError(self.message, code=self.code, params={"value": value})


def _whole_pattern(
    validator: Any, pattern: str, instance: Any, schema: Mapping[str, Any]
) -> Iterator[SchemaError]:
    if validator.is_type(instance, "string") and whole_match(pattern, instance) is None:
        yield SchemaError(f"{instance!r} does not match {pattern!r}")


SchemaValidator = validators.extend(Draft4Validator, {"pattern": _whole_pattern})
"""JSON Schema draft 4 (what OpenAPI 3.0 speaks) with `pattern` over the whole string."""


class WholeRegexField(serializers.CharField):
    """DRF's `RegexField`, matching the whole value (its pattern is in the OpenAPI schema)."""

    def __init__(self, regex: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validators.append(WholeRegexValidator(regex, message=f"must match {regex}"))


def object_refusals(schema: Mapping[str, Any], body: Any) -> dict[str, list[str]]:
    """Field -> what an object `schema` (its ``properties``, no others) refuses in `body`;
    an empty dict when it takes it. A body that is not an object is refused as ``body``."""
    if not isinstance(body, dict):
        return {"body": [f"a JSON object of {sorted(schema['properties'])}"]}
    refused: dict[str, list[str]] = {}
    for problem in SchemaValidator(schema).iter_errors(body):
        if problem.validator == "additionalProperties":
            for name in sorted(set(body) - set(schema["properties"])):
                refused.setdefault(name, []).append("unknown field")
            continue
        name = str(problem.absolute_path[0]) if problem.absolute_path else "body"
        refused.setdefault(name, []).append(problem.message[:200])
    return refused
