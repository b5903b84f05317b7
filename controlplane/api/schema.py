"""The OpenAPI schema's generator: every operation also declares the errors any request can get.

Views declare their own success and domain error responses with `@extend_schema`; this adds
the shared ones (400 bad input, 401, 403, 404 for paths with parameters, 406, 415 for request
bodies, 429), all with the `Error` shape, so the schema matches what the server can answer.
"""

from __future__ import annotations

import re
from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse

from controlplane.api.errors import ErrorSerializer

_DESCRIPTIONS = {
    "400": "The request is invalid (fields, query parameters, cursor or JSON).",
    "401": "No or an invalid token / session.",
    "403": "The user lacks the role this endpoint needs.",
    "404": "Nothing there.",
    "406": "The Accept header names no type the endpoint renders.",
    "415": "The body is not application/json.",
    "429": "Too many requests; retry after `Retry-After` seconds.",
}


class ApiAutoSchema(AutoSchema):
    def get_operation_id(self) -> str:
        """`job_list_get`, `job_operation_request_post`, …: from the view, unique."""
        name = type(self.view).__name__.removesuffix("View")
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
        return f"{snake}_{self.method.lower()}"

    def _get_response_bodies(self, direction: Any = "response") -> Any:
        responses = super()._get_response_bodies(direction)
        codes = ["400", "401", "403", "406", "429"]
        if "{" in self.path:
            codes.append("404")
        if self.method in ("POST", "PUT", "PATCH"):
            codes.append("415")
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
