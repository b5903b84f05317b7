"""Each operation kind's parameters as a JSON schema: the one declaration the server checks a
request against (400 naming the field) and the OpenAPI schema publishes (a `oneOf` per kind).

It is also where each kind's parameter names and defaults come from: a kind's `clean` asks
`allowed_names` and `default_of` rather than listing them again.

What the schema accepts is well-formed; what a kind's `clean` then refuses depends on the job,
its lineage or other jobs (an unknown snapshot, a parallelism above M, nothing to change) and
is a 409 or 422, never a 400 (controlplane/operations/services.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from jsonschema.exceptions import ValidationError

from controlplane.applications.models import JOB_NAME_PATTERN, MAX_PARALLELISM_LIMIT, NAME_PATTERN
from controlplane.errors import InvalidRequest
from controlplane.jobs.spark_conf import OPERATOR_SPARK_CONF, spark_conf_schema
from controlplane.patterns import REVISION_FORMAT, SchemaValidator
from controlplane.refnames import REF_PATTERN, REVISION_PATTERN

MAX_WAIT_S: Final = 86400.0
"""The longest any timeout or deadline of an operation may be (one day)."""
RESCALE_MODES: Final = ("live", "restart", "auto")
MIGRATE_MODES: Final = ("copy", "transform", "rehash")
ALIGN_COMMANDS: Final = ("align", "catch_up", "abort")

_REF: Final = {"type": "string", "pattern": REF_PATTERN}
_REVISION: Final = {"type": "string", "format": REVISION_FORMAT, "pattern": REVISION_PATTERN}
_NAME: Final = {"type": "string", "pattern": NAME_PATTERN}
_EPOCH: Final = {"type": "integer", "minimum": 1}
_PARALLELISM: Final = {"type": "integer", "minimum": 1, "maximum": MAX_PARALLELISM_LIMIT}


def _seconds(description: str, default: float | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "number",
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": MAX_WAIT_S,
        "description": f"{description} (seconds, above 0, at most one day).",
    }
    if default is not None:
        schema["default"] = default
    return schema


def _flag(default: bool = False) -> dict[str, Any]:
    return {"type": "boolean", "default": default}


def _object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = list(required)
    return schema


_STOP_DEADLINE: Final = _seconds(
    "How long to wait for the job to stop at an epoch boundary", default=60.0
)
_START_TIMEOUT: Final = _seconds("How long to wait for the relaunched run to start", 180.0)
_JSON_OBJECT: Final = {"type": "object"}

PARAMS: Final[Mapping[str, dict[str, Any]]] = {
    "start": _object({"from_empty": _flag(), "start_timeout_s": _START_TIMEOUT}),
    "stop": _object({"stop_deadline_s": _STOP_DEADLINE}),
    "savepoint": _object(
        {
            "name": {**_REF, "description": "The tag's name (default: generated)."},
            "snapshot": {**_REVISION, "description": "Tag this revision (default: the head)."},
            "force_epoch": {**_flag(), "description": "Commit an epoch first (not with snapshot)."},
            "timeout_s": _seconds("How long to wait for the forced epoch", 300.0),
        }
    ),
    "rescale": _object(
        {
            "parallelism": _PARALLELISM,
            "mode": {"type": "string", "enum": list(RESCALE_MODES), "default": "auto"},
            "timeout_s": _seconds("How long the rescale may take", 300.0),
            "stop_deadline_s": _STOP_DEADLINE,
        },
        required=("parallelism",),
    ),
    "rollback": _object(
        {
            "to": {**_REVISION, "description": "An earlier snapshot of the branch (id, tag, …)."},
            "stop_deadline_s": _STOP_DEADLINE,
            "start_timeout_s": _START_TIMEOUT,
            "confirm_published": {
                **_flag(),
                "description": "Required (true) when the job writes to a log sink (Kafka, "
                "Redis Streams, RabbitMQ Streams): what it published stays published.",
            },
        },
        required=("to",),
    ),
    "fork": _object(
        {
            "snapshot": {**_REVISION, "description": "The revision to fork from (id, tag, …)."},
            "branch": {**_REF, "description": "The new branch."},
            "job_name": {**_NAME, "description": "The new job (default: <application>-<branch>)."},
            "version": {"type": "integer", "minimum": 1, "description": "An existing version."},
            "parallelism": _PARALLELISM,
            "spark_conf": spark_conf_schema(),
            "start": _flag(),
            "start_timeout_s": _START_TIMEOUT,
            "job": {
                "type": "string",
                "pattern": JOB_NAME_PATTERN,
                "description": "Admins only: a new version running this registered job.",
            },
            "code_version": {
                "type": "string",
                "maxLength": 255,
                "pattern": "^[^\\x00]*$",
                "description": "Admins only: the new version's code version.",
            },
            "config": {**_JSON_OBJECT, "description": "Admins only: the new version's config."},
            "sinks": {
                "type": "array",
                "items": {**_NAME},
                "uniqueItems": True,
                "description": "Registered sinks the fork writes to instead of its version's "
                "([] for none): the fork runs a new version like it but for its sinks. Two "
                "branches never write one sink.",
            },
        },
        required=("snapshot", "branch"),
    ),
    "migrate": {
        "oneOf": [
            _object(
                {
                    "mode": {"type": "string", "enum": ["copy"]},
                    "store": {**_NAME, "description": "A registered store (GET /api/stores/)."},
                    "stop_deadline_s": _STOP_DEADLINE,
                    "start_timeout_s": _START_TIMEOUT,
                },
                required=("mode", "store"),
            ),
            _object(
                {
                    "mode": {"type": "string", "enum": ["transform"]},
                    "function": {
                        "type": "string",
                        "pattern": JOB_NAME_PATTERN,
                        "description": "A registered state migration (GET /api/entry-points/).",
                    },
                    "stop_deadline_s": _STOP_DEADLINE,
                    "start_timeout_s": _START_TIMEOUT,
                },
                required=("mode", "function"),
            ),
            _object(
                {
                    "mode": {"type": "string", "enum": ["rehash"]},
                    "max_parallelism": _PARALLELISM,
                    "stop_deadline_s": _STOP_DEADLINE,
                    "start_timeout_s": _START_TIMEOUT,
                },
                required=("mode", "max_parallelism"),
            ),
        ]
    },
    "align": _object(
        {
            "upstream_job": {**_NAME, "description": "The job whose branch output this reads."},
            "source": {**_NAME, "description": "The source's name.", "default": "upstream"},
            "command": {"type": "string", "enum": list(ALIGN_COMMANDS), "default": "align"},
            "from_epoch": _EPOCH,
            "timeout_s": _seconds("How long the alignment may take", 600.0),
        },
        required=("upstream_job",),
    ),
    "hotswap": _object(
        {
            "new_job": {**_NAME, "description": "The job that takes over."},
            "swap_epoch": _EPOCH,
            "lead_epochs": {"type": "integer", "minimum": 1, "default": 3},
            "timeout_s": _seconds("How long the swap may take", 900.0),
        },
        required=("new_job",),
    ),
}

_VALIDATORS: Final = {kind: SchemaValidator(schema) for kind, schema in PARAMS.items()}


def _fields(error: ValidationError) -> dict[str, list[str]]:
    """The fields one schema error names, as the API names them (``spark_conf.<key>``)."""
    path = ".".join(str(p) for p in error.absolute_path)
    prefix = f"{path}." if path else ""
    instance = error.instance
    if error.validator == "additionalProperties" and isinstance(instance, Mapping):
        allowed = set(error.schema.get("properties", {}))
        unknown = sorted(str(k) for k in instance if k not in allowed)
        if path == "spark_conf":
            note = (
                "not a setting an operator may choose (allowed: "
                f"{', '.join(sorted(OPERATOR_SPARK_CONF))}); JVM options, class paths, jars, "
                "files, listeners and every other key come only from an admin's version"
            )
        else:
            note = f"unknown parameter; this kind takes {sorted(allowed)}"
        return {f"{prefix}{name}": [note] for name in unknown}
    if error.validator == "required" and isinstance(instance, Mapping):
        missing = [str(r) for r in error.validator_value if r not in instance]
        return {f"{prefix}{name}": ["required"] for name in missing}
    return {path or "params": [_message(error)]}


def _message(error: ValidationError) -> str:
    """What is wrong, in the words the other refusals use."""
    got = f"got {error.instance!r}"[:200]
    if error.validator == "maximum":
        return f"at most {error.validator_value:g}; {got}"
    if error.validator == "minimum":
        above = "above" if error.schema.get("exclusiveMinimum") else "at least"
        return f"{above} {error.validator_value:g}; {got}"
    if error.validator == "type":
        return (
            f"must be {'an' if error.validator_value == 'integer' else 'a'} "
            f"{error.validator_value}; {got}"
        )
    if error.validator == "enum":
        return f"one of {error.validator_value}; {got}"
    if error.validator == "pattern":
        return f"must match {error.validator_value}; {got}"
    return str(error.message)


def check_params(kind: str, params: Any) -> None:
    """InvalidRequest (400) naming every field of `params` the kind's schema refuses."""
    validator = _VALIDATORS[kind]
    errors: dict[str, list[str]] = {}
    found = list(validator.iter_errors(params))
    if kind == "migrate" and found and isinstance(params, Mapping):
        # Name what is wrong in the variant the request's mode picks, not "not one of".
        variants = PARAMS["migrate"]["oneOf"]
        chosen = [v for v in variants if params.get("mode") in v["properties"]["mode"]["enum"]]
        if chosen:
            found = list(SchemaValidator(chosen[0]).iter_errors(params))
        else:
            modes = [v["properties"]["mode"]["enum"][0] for v in variants]
            errors["mode"] = [f"one of {modes}; got {params.get('mode')!r}"]
            found = []
    for error in found:
        for name, messages in _fields(error).items():
            errors.setdefault(name, []).extend(messages)
    if errors:
        names = "; ".join(
            f"{name} is required" if errors[name] == ["required"] else f"{name}: {errors[name][0]}"
            for name in sorted(errors)
        )
        refused_conf = all(name.startswith("spark_conf.") for name in errors)
        raise InvalidRequest(
            f"{kind} parameters refused: {names}",
            fields=errors,
            code="spark_conf_refused" if refused_conf else InvalidRequest.code,
        )


def params_schema(kind: str) -> dict[str, Any]:
    return PARAMS[kind]


def _properties(kind: str) -> dict[str, Any]:
    """Every parameter the kind's schema declares (over all of its variants)."""
    schema = PARAMS[kind]
    properties: dict[str, Any] = {}
    for variant in schema.get("oneOf", [schema]):
        properties.update(variant["properties"])
    return properties


def allowed_names(kind: str) -> frozenset[str]:
    """The parameter names the kind takes."""
    return frozenset(_properties(kind))


def default_of(kind: str, name: str) -> Any:
    """The default the kind's schema declares for parameter `name` (KeyError when none)."""
    return _properties(kind)[name]["default"]


ADMIN_ONLY_PARAMS: Final[Mapping[str, frozenset[str]]] = {
    "fork": frozenset({"job", "code_version", "config"}),
}
"""Per kind, the parameters only an admin may give (they choose code)."""

DEFAULT_STOP_DEADLINE_S: Final[float] = _STOP_DEADLINE["default"]
DEFAULT_START_TIMEOUT_S: Final[float] = _START_TIMEOUT["default"]


__all__ = [
    "PARAMS",
    "allowed_names",
    "check_params",
    "default_of",
    "params_schema",
]
