"""The OpenAPI schema's generator: every operation also declares the errors any request can get.

Views declare their own success and domain error responses with `@extend_schema`; this adds
the shared ones (400 bad input, 401, 403, 404 for paths with parameters, 406, 415 for request
bodies, 429), all with the `Error` shape, so the schema matches what the server can answer.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse
from rest_framework.permissions import SAFE_METHODS

from controlplane.api.errors import ErrorSerializer
from controlplane.api.operation_docs import DESCRIPTIONS
from controlplane.patterns import REVISION_FORMAT, SchemaValidator
from controlplane.refnames import REF_PATTERN, REVISION_PATTERN

_DESCRIPTIONS = {
    "400": "The request is invalid (fields, query parameters, cursor or JSON).",
    "401": "No or an invalid token / session.",
    "403": "The user lacks the role this endpoint needs.",
    "404": "Nothing there.",
    "406": "The Accept header names no type the endpoint renders.",
    "413": "The body is larger than the server accepts (`EPOCHAL_MAX_BODY_BYTES`).",
    "415": "The body is not application/json.",
    "429": "Too many requests; retry after `Retry-After` seconds.",
}


class ApiAutoSchema(AutoSchema):
    def get_operation_id(self) -> str:
        """`job_list_get`, `job_operation_request_post`, …: from the view, unique."""
        name = type(self.view).__name__.removesuffix("View")
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
        return f"{snake}_{self.method.lower()}"

    def get_description(self) -> str:
        """What the operation does (`operation_docs.DESCRIPTIONS`, else its summary) and the
        role it needs; never a docstring the view inherits (the base view's is about the
        code)."""
        own = DESCRIPTIONS.get(self.get_operation_id()) or self.get_summary() or ""
        method = self.method.upper()
        attribute = "read_role" if method in SAFE_METHODS else "write_role"
        role = getattr(self.view, attribute, None)
        needs = f"Needs the `{role}` role." if role else ""
        return " ".join(part for part in (own, needs) if part)

    def _get_response_bodies(self, direction: Any = "response") -> Any:
        responses = super()._get_response_bodies(direction)
        codes = ["400", "401", "403", "406", "429"]
        if "{" in self.path:
            codes.append("404")
        if self.method in ("POST", "PUT", "PATCH"):
            codes += ["413", "415"]
        for code in codes:
            if code not in responses:
                responses[code] = self._get_response_for_code(
                    OpenApiResponse(ErrorSerializer, description=_DESCRIPTIONS[code]),
                    code,
                    direction=direction,
                )
        return responses


def error(description: str) -> OpenApiResponse:
    return OpenApiResponse(ErrorSerializer, description=description)


REF = {"type": "string", "pattern": REF_PATTERN}
REVISION = {"type": "string", "format": REVISION_FORMAT, "pattern": REVISION_PATTERN}

NO_NUL = "^[^\\x00]*$"
"""Strings the server takes: anything but NUL (no database stores one; it answers 400)."""

LINKS: dict[tuple[str, str], dict[str, tuple[str, dict[str, str]]]] = {
    # (operation, status) -> link name -> (target operation, its parameters)
    ("application_list_post", "201"): {
        "GetApplication": ("application_detail_get", {"name": "$response.body#/name"}),
        "ListVersions": ("version_list_get", {"name": "$response.body#/name"}),
        "CreateVersion": ("version_list_post", {"name": "$response.body#/name"}),
        "ListBranches": ("branch_list_get", {"name": "$response.body#/name"}),
    },
    ("version_list_post", "201"): {
        "GetVersion": (
            "version_detail_get",
            {"name": "$request.path.name", "number": "$response.body#/number"},
        ),
    },
    ("job_list_post", "201"): {
        "GetJob": ("job_detail_get", {"name": "$response.body#/name"}),
        "ListRuns": ("job_run_list_get", {"name": "$response.body#/name"}),
        "RequestOperation": ("job_operation_request_post", {"name": "$response.body#/name"}),
    },
    ("job_operation_request_post", "202"): {
        "GetOperation": ("operation_detail_get", {"operation_id": "$response.body#/id"}),
        "CancelOperation": ("operation_cancel_post", {"operation_id": "$response.body#/id"}),
    },
    ("application_operation_request_post", "202"): {
        "GetOperation": ("operation_detail_get", {"operation_id": "$response.body#/id"}),
        "CancelOperation": ("operation_cancel_post", {"operation_id": "$response.body#/id"}),
    },
    ("token_list_post", "201"): {
        "GetToken": ("token_detail_get", {"token_id": "$response.body#/id"}),
        "RotateToken": ("token_rotate_post", {"token_id": "$response.body#/id"}),
        "RevokeToken": ("token_detail_delete", {"token_id": "$response.body#/id"}),
    },
    ("token_rotate_post", "201"): {
        "GetToken": ("token_detail_get", {"token_id": "$response.body#/id"}),
        "RevokeToken": ("token_detail_delete", {"token_id": "$response.body#/id"}),
    },
    ("user_list_post", "201"): {
        "GetUser": ("user_detail_get", {"username": "$response.body#/username"}),
        "ChangeUser": ("user_detail_patch", {"username": "$response.body#/username"}),
    },
}


def _operations(result: dict[str, Any]) -> Any:
    for path in result.get("paths", {}).values():
        for operation in path.values():
            if isinstance(operation, dict) and "operationId" in operation:
                yield operation


_JSON_VALUE_REF = "#/components/schemas/JsonValue"
JSON_VALUE = {
    "description": "Any JSON value without NUL characters (at most 32 levels deep).",
    "nullable": True,
    "not": {"$ref": "#/components/schemas/JsonWithNul"},
}
"""Said as "not a value with a NUL somewhere" rather than as a union of the JSON types whose
arrays and objects hold `JsonValue` again: the same values, but client generators that cannot
follow a union back to itself (openapi-python-client) read it as any JSON value."""
JSON_WITH_NUL = {
    "description": "A JSON value with a NUL character in a string somewhere in it.",
    "anyOf": [
        {"type": "string", "pattern": "\\x00"},
        {"type": "array", "items": {}, "not": {"items": {"$ref": _JSON_VALUE_REF}}},
        {
            "type": "object",
            "not": {"additionalProperties": {"$ref": _JSON_VALUE_REF}},
        },
    ],
}


def _exact(schema: dict[str, Any]) -> None:
    """What the strict parser refuses, in `schema` (a request body's or a field's)."""
    if schema.get("type") == "string" and not {"enum", "format", "pattern"} & set(schema):
        schema["pattern"] = NO_NUL
    elif schema.get("type") == "object" and "properties" not in schema:
        extra = schema.get("additionalProperties", True)
        if extra is True or extra == {}:
            schema["additionalProperties"] = {"$ref": "#/components/schemas/JsonValue"}


def strict_request_bodies(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: request bodies take no field they do not declare
    (`additionalProperties: false`), as `StrictSerializer` enforces with a 400, and no string
    anywhere holds a NUL (the strict parser's 400)."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    for name, component in schemas.items():
        if name.endswith("Request") and component.get("type") == "object":
            component.setdefault("additionalProperties", False)
            for field in component.get("properties", {}).values():
                _exact(field)
    schemas["JsonValue"] = JSON_VALUE
    schemas["JsonWithNul"] = JSON_WITH_NUL
    # A version names a job installed here: the schema lists them (an unknown name is a 400).
    from runners.entry_points import JOBS, registered

    job = schemas.get("VersionCreateRequest", {}).get("properties", {}).get("job")
    if job is not None:
        job["enum"] = sorted({entry.name for entry in registered(JOBS)})
    return result


def operation_request_bodies(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: an operation request is one of the kinds, each with
    its own parameters (`controlplane/operations/params.py`, what the server checks), told
    apart by `kind`; an application's operation endpoint takes a fork only."""
    from controlplane.operations.params import PARAMS
    from controlplane.operations.registry import SPECS

    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    generic = schemas.get("OperationRequestRequest")
    if generic is None:
        return result
    reason = generic["properties"]["reason"]
    mapping: dict[str, str] = {}
    for kind in sorted(PARAMS):
        name = f"{kind.capitalize()}OperationRequest"
        params = copy.deepcopy(PARAMS[kind])
        for variant in params.get("oneOf", [params]):
            for field in variant.get("properties", {}).values():
                _exact(field)  # free-form objects (a fork's config) hold JSON values only
        required = ["kind"]
        if "required" in params or "oneOf" in params:
            required.append("params")
        schemas[name] = {
            "type": "object",
            "description": f"`{kind}`: {SPECS[kind].summary}.",
            "properties": {
                "kind": {"type": "string", "enum": [kind]},
                "params": params,
                "reason": reason,
            },
            "required": required,
            "additionalProperties": False,
        }
        mapping[kind] = f"#/components/schemas/{name}"
    schemas["OperationRequestRequest"] = {
        "oneOf": [{"$ref": ref} for ref in mapping.values()],
        "discriminator": {"propertyName": "kind", "mapping": mapping},
    }
    fork = {"$ref": mapping["fork"]}
    for operation in _operations(result):
        if operation["operationId"] == "application_operation_request_post":
            for media in operation.get("requestBody", {}).get("content", {}).values():
                media["schema"] = fork
    return result


def exact_parameters(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: free-text parameters declare that NUL is refused."""
    for operation in _operations(result):
        for parameter in operation.get("parameters", []):
            schema = parameter.get("schema", {})
            if schema.get("type") == "string" and not {"enum", "format", "pattern"} & set(schema):
                schema["pattern"] = NO_NUL
            if parameter.get("name") == "cursor":
                operation["responses"].setdefault("422", _error("A cursor this API did not issue."))
    return result


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def response_links(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: OpenAPI links from what a create answers to the
    requests on what it created (clients and stateful fuzzers follow them)."""
    ids = {operation["operationId"] for operation in _operations(result)}
    for operation in _operations(result):
        for status, response in operation.get("responses", {}).items():
            links = LINKS.get((operation["operationId"], status), {})
            declared = {
                name: {"operationId": target, "parameters": parameters}
                for name, (target, parameters) in links.items()
                if target in ids
            }
            if declared:
                response["links"] = declared
    return result


_CONSTRAINTS = ("type", "enum", "format", "pattern", "minLength", "maxLength", "minimum", "maximum")


def _walk(node: Any) -> Any:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def valid_defaults(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: a default the field's own schema refuses (an empty
    `code_version` where a given one may not be empty, an empty e-mail address) is what the
    server uses when the field is omitted, not a value a client may send: the schema says so in
    the description instead of a `default` validators reject."""
    checker = SchemaValidator.FORMAT_CHECKER
    for schema in _walk(result.get("components", {})):
        if "default" not in schema or "$ref" in str(schema):
            continue
        own = {key: schema[key] for key in _CONSTRAINTS if key in schema}
        if SchemaValidator(own, format_checker=checker).is_valid(schema["default"]):
            continue
        default = schema.pop("default")
        omitted = f"Omitted: {default!r}." if default != "" else "Omitted: none (empty)."
        schema["description"] = " ".join(filter(None, (schema.get("description"), omitted)))
    return result
