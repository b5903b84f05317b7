"""Errors the control plane's services raise, each with a stable code and words a user can act on.

The REST API turns them into ``{"error": {"code", "message", "fields", "detail"}}`` with the
class's HTTP status; the CLI prints the message; the dashboard shows it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class EpochalError(Exception):
    """Base of the control plane's domain errors."""

    code = "error"
    http_status = 400

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        fields: Mapping[str, list[str]] | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.fields = dict(fields or {})
        self.detail = dict(detail or {})

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "message": self.message,
            "fields": self.fields,
            "detail": self.detail,
        }


class InvalidRequest(EpochalError):
    """The request names something impossible or malformed (400)."""

    code = "invalid"
    http_status = 400


class UnusableRequest(InvalidRequest):
    """Well-formed (the schema takes it), but what it names cannot be used: an unknown
    snapshot, a parallelism above M, an unregistered function (422)."""

    http_status = 422


class StateRefusal(InvalidRequest):
    """Well-formed, but the job's current state refuses it: nothing to change, no commits
    yet, a live rescale of a stopped job (409)."""

    http_status = 409


class NotFound(EpochalError):
    code = "not_found"
    http_status = 404


class Conflict(EpochalError):
    """The request clashes with the current state, e.g. another running operation (409)."""

    code = "conflict"
    http_status = 409


class Forbidden(EpochalError):
    code = "forbidden"
    http_status = 403


class Unprocessable(EpochalError):
    """Well-formed, but cannot be processed as asked, e.g. an idempotency key reused (422)."""

    code = "unprocessable"
    http_status = 422


class OperationFailed(EpochalError):
    """A phase found the operation cannot succeed; the operation ends failed with this."""

    code = "operation_failed"
    http_status = 422
