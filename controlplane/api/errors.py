"""One error shape for every failure: ``{"error": {code, message, fields, detail}}``.

Domain errors (`EpochalError` and the lineage / store / application lookups) carry their own
code and status; DRF's exceptions (validation, authentication, permission, 404, 405, 406, 415,
429, malformed JSON) and Django's `ValidationError` / `Http404` are mapped here, once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from django.urls import NoReverseMatch, reverse
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response

from controlplane import availability
from controlplane.applications.errors import UnknownApplicationError, UnknownVersionError
from controlplane.errors import EpochalError
from controlplane.lineage.errors import InvalidCursorError, LineageError, UnknownRevisionError
from snapshots_store.errors import InvalidNameError, ObjectNotFoundError, StoreError
from snapshots_store.errors import UnknownRevisionError as StoreUnknownRevisionError

log = logging.getLogger(__name__)

_DRF_CODES = {
    exceptions.ParseError: "malformed_request",
    exceptions.NotAuthenticated: "not_authenticated",
    exceptions.AuthenticationFailed: "authentication_failed",
    exceptions.PermissionDenied: "permission_denied",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.Throttled: "throttled",
}


def error_body(
    code: str,
    message: str,
    *,
    fields: Mapping[str, list[str]] | None = None,
    detail: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "error": {
            "code": code,
            "message": message,
            "fields": dict(fields or {}),
            "detail": dict(detail or {}),
        }
    }


def _flatten(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested validation detail as ``{"a.b": ["message", …]}``."""
    if isinstance(detail, Mapping):
        out: dict[str, list[str]] = {}
        for key, value in detail.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if key == "non_field_errors":
                name = prefix or "non_field_errors"
            for k, v in _flatten(value, name).items():
                out.setdefault(k, []).extend(v)
        return out
    if isinstance(detail, list):
        if all(not isinstance(item, Mapping | list) for item in detail):
            return {prefix or "non_field_errors": [str(item) for item in detail]}
        out = {}
        for index, item in enumerate(detail):
            for k, v in _flatten(item, f"{prefix}.{index}" if prefix else str(index)).items():
                out.setdefault(k, []).extend(v)
        return out
    return {prefix or "non_field_errors": [str(detail)]}


def _message_of(fields: Mapping[str, list[str]]) -> str:
    parts = [f"{name}: {'; '.join(messages)}" for name, messages in fields.items()]
    return "invalid request: " + " | ".join(parts) if parts else "invalid request"


def exception_response(exc: BaseException) -> Response | None:
    """The structured response for `exc`, or None when it is not an error we know."""
    headers: dict[str, str] = {}
    dependency = availability.unavailable(exc)
    if dependency is not None:
        log.warning("%s unavailable answering an API request: %s", dependency, exc)
        return Response(
            error_body(f"{dependency}_unavailable", availability.message(dependency),
                       detail={"retry_after_s": availability.RETRY_AFTER_S}),
            status=503,
            headers={"Retry-After": str(availability.RETRY_AFTER_S)},
        )  # fmt: skip
    if isinstance(exc, EpochalError):
        body = {"error": exc.to_dict()}
        return Response(body, status=exc.http_status)
    if isinstance(exc, UnknownApplicationError):
        return Response(
            error_body("application_not_found", str(exc), detail={"application": exc.name}),
            status=404,
        )
    if isinstance(exc, UnknownVersionError):
        return Response(error_body("version_not_found", str(exc)), status=404)
    if isinstance(exc, UnknownRevisionError):
        return Response(
            error_body("unknown_revision", str(exc), detail={"rev": exc.rev}), status=404
        )
    if isinstance(exc, InvalidCursorError):
        return Response(
            error_body("invalid_cursor", str(exc), fields={"cursor": ["not a cursor we issued"]}),
            status=422,
        )
    if isinstance(exc, LineageError):
        return Response(error_body("invalid", str(exc)), status=400)
    if isinstance(exc, ObjectNotFoundError | StoreUnknownRevisionError):
        return Response(error_body("not_in_store", str(exc)), status=404)
    if isinstance(exc, InvalidNameError):
        return Response(error_body("invalid_name", str(exc)), status=400)
    if isinstance(exc, StoreError):
        log.warning("store error answering an API request", exc_info=exc)
        return Response(error_body("store_error", str(exc)), status=502)
    if isinstance(exc, DjangoValidationError):
        fields = (
            {k: [str(m) for m in v] for k, v in exc.message_dict.items()}
            if hasattr(exc, "error_dict")
            else {"non_field_errors": [str(m) for m in exc.messages]}
        )
        return Response(error_body("invalid", _message_of(fields), fields=fields), status=400)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or "not found")
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        return Response(error_body("invalid", _message_of(fields), fields=fields), status=400)
    if isinstance(exc, exceptions.APIException):
        if getattr(exc, "auth_header", None):
            headers["WWW-Authenticate"] = exc.auth_header  # type: ignore[attr-defined]
        detail: dict[str, Any] = {}
        if isinstance(exc, exceptions.Throttled) and exc.wait is not None:
            headers["Retry-After"] = str(int(exc.wait))
            detail["retry_after_s"] = int(exc.wait)
        code = next(
            (c for cls, c in _DRF_CODES.items() if isinstance(exc, cls)),
            str(getattr(exc, "default_code", "error")),
        )
        message = str(exc.detail) if not isinstance(exc.detail, list | dict) else str(exc)
        return Response(
            error_body(code, message, detail=detail), status=exc.status_code, headers=headers
        )
    return None


def exception_handler(exc: Exception, context: Mapping[str, Any]) -> Response:
    """DRF's EXCEPTION_HANDLER: every error as ``{"error": …}``; unknown ones as a logged 500."""
    response = exception_response(exc)
    if response is not None:
        _link_operation(response, context.get("request"))
        if response.status_code == 401:
            response["WWW-Authenticate"] = response.get("WWW-Authenticate", 'Token realm="api"')
            _say_what_is_expected(response)
        elif response.status_code == 415:
            response.data["error"]["message"] += " Send the body as JSON with the header "
            response.data["error"]["message"] += "`Content-Type: application/json`."
        return response
    log.exception("unhandled error answering %s", context.get("request"), exc_info=exc)
    return Response(
        error_body("internal_error", "internal error; it was logged on the server"),
        status=status.HTTP_500_INTERNAL_SERVER_ERROR,
    )


def _say_what_is_expected(response: Response) -> None:
    """A 401 names the header it wants, as its WWW-Authenticate challenge does."""
    scheme = response["WWW-Authenticate"].split(" ", 1)[0] or "Token"
    how = (
        "the token configured as EPOCHAL_METRICS_TOKEN, or an API token"
        if scheme == "Bearer"
        else "an API token from `epochal token USERNAME`, or sign in at /login/"
    )
    error = response.data["error"]
    error["message"] += f" Expected: `Authorization: {scheme} <token>` ({how})."


def _link_operation(response: Response, request: Any) -> None:
    """A conflict naming an operation also gives its URL (`detail.operation_url`)."""
    data = response.data if isinstance(response.data, dict) else {}
    detail = data.get("error", {}).get("detail")
    if request is None or not isinstance(detail, dict) or not detail.get("operation"):
        return
    try:
        path = reverse("api:operation-detail", args=[detail["operation"]])
    except NoReverseMatch:
        return
    detail["operation_url"] = request.build_absolute_uri(path)


# -- the shape, for the OpenAPI schema --------------------------------------------------------


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="Stable machine-readable code, e.g. `conflict`.")
    message = serializers.CharField(help_text="What went wrong, in words a user can act on.")
    fields = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        help_text="Field name -> messages (empty unless the request had bad fields).",
    )
    detail = serializers.DictField(help_text="Extra facts, e.g. the running operation's id.")


class ErrorSerializer(serializers.Serializer):
    error = ErrorDetailSerializer()
