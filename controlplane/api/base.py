"""The base of every API view: role check, throttling, request audit.

Every mutating request and every refused one (400 or 403) is written to the audit log with
who, what (method and route), the target (path), the status code and an outcome; reads are
recorded too when `EPOCHAL_AUDIT_READS=true`. Anonymous refusals (401) are counted instead
(controlplane/audit/rejections.py).
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from rest_framework.permissions import SAFE_METHODS
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import SimpleRateThrottle
from rest_framework.views import APIView

from controlplane.accounts.roles import ADMIN, VIEWER
from controlplane.api.permissions import HasRole
from controlplane.audit.rejections import UNAUTHENTICATED, count_rejection
from controlplane.audit.services import audit_request
from controlplane.proxies import client_address

_CONVERTER = re.compile(r"<(?:\w+:)?(\w+)>")


def route_name(route: str) -> str:
    """A URL route as the audit names it: ``jobs/{name}/`` for ``jobs/<str:name>/``."""
    return _CONVERTER.sub(r"{\1}", route)


def audit_api_request(request: Any, response: Any, *, source: str = "api") -> None:
    """Record `request` when it mutates, was refused, or reads are audited."""
    method = request.method or ""
    status_code = int(response.status_code)
    if status_code == 401:
        # Anonymous: counted, not a row each (controlplane/audit/rejections.py). A known but
        # revoked or expired token is audited by the authentication itself.
        count_rejection(UNAUTHENTICATED, request)
        return
    # Reads too: a read with a refused parameter (e.g. ?branch=../../etc), of something that
    # does not exist or that cannot be answered is a probe worth a row. 429s are counted by the
    # throttle, not written: a row each would be the flood the throttle stops.
    refused = status_code >= 400 and status_code != 429
    if method in SAFE_METHODS and not refused and not settings.EPOCHAL_AUDIT_READS:
        return
    match = getattr(request, "resolver_match", None)
    route = match.route if match is not None and match.route else request.path
    route = route_name(route)
    try:
        user = request.user
    except Exception:  # authentication itself failed: the request is anonymous
        user = None
    operation = getattr(request, "_epochal_operation", None)
    detail: dict[str, Any] = {}
    if user is not None and getattr(user, "is_authenticated", False) and not hasattr(user, "_meta"):
        detail["actor"] = user.get_username()  # e.g. the metrics scraper's token: no user row
        user = None
    detail.update(getattr(request, "_epochal_audit_detail", {}))
    if status_code >= 400 and isinstance(getattr(response, "data", None), dict):
        error = response.data.get("error")
        if isinstance(error, dict):
            detail = {"code": error.get("code"), "message": str(error.get("message"))[:500]}
            if error.get("fields"):
                detail["fields"] = sorted(error["fields"])[:20]
    audit_request(
        user=user,
        action=f"{method} /{route.lstrip('/')}",
        target=request.path,
        status_code=status_code,
        source=source,
        operation=operation,
        detail=detail,
    )


class _WindowThrottle(SimpleRateThrottle):
    """Requests per key in fixed windows of the rate's period, counted in the shared cache
    (`CACHE_URL`: every process and replica counts together) with one atomic increment.

    (DRF's own throttle keeps the time of every request of the period in one cache entry and
    rewrites it on each request — at 100,000/hour that list was most of a busy user's
    request time.) A client may get up to twice the rate across a window boundary.
    """

    setting = ""

    def get_rate(self) -> str | None:
        return str(getattr(settings, self.setting)) or None

    def allow_request(self, request: Any, view: Any) -> bool:
        if self.rate is None:
            return True
        ident = self.get_cache_key(request, view)
        if ident is None:
            return True
        self.now = self.timer()
        window = int(self.now // self.duration)
        self.window_ends = (window + 1) * self.duration
        key = f"{ident}:{window}"
        self.cache.add(key, 0, self.duration + 1)
        try:
            count = self.cache.incr(key)
        except ValueError:  # expired between add and incr
            self.cache.set(key, 1, self.duration + 1)
            count = 1
        return bool(count <= self.num_requests)

    def wait(self) -> float | None:
        return max(self.window_ends - self.now, 1.0)


class ApiThrottle(_WindowThrottle):
    """`EPOCHAL_API_RATE` requests per API token (each of a user's tokens counts on its own),
    or per user for a dashboard session."""

    setting = "EPOCHAL_API_RATE"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        token = getattr(request, "auth", None)
        if token is not None and getattr(token, "prefix", None):
            return f"throttle:token:{token.prefix}"
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated and getattr(user, "pk", None):
            return f"throttle:user:{user.pk}"
        return None


class AddressThrottle(_WindowThrottle):
    """`EPOCHAL_API_ADDRESS_RATE` requests per client address (behind the trusted proxies:
    `controlplane.proxies`), signed in or not — checked before anything else of the request."""

    setting = "EPOCHAL_API_ADDRESS_RATE"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        return f"throttle:address:{client_address(request)}"


class ApiView(APIView):
    """Views set `read_role` / `write_role`; handlers stay thin (parse, call, render)."""

    permission_classes = [HasRole]
    throttle_classes = [ApiThrottle]
    read_role: str = VIEWER
    write_role: str = ADMIN

    def check_permissions(self, request: Request) -> None:
        # The address first: anonymous requests count too (they are refused right after).
        address = AddressThrottle()
        if not address.allow_request(request, self):
            self.throttled(request, address.wait())
        super().check_permissions(request)

    def finalize_response(
        self, request: Request, response: Response, *args: Any, **kwargs: Any
    ) -> Response:
        response = super().finalize_response(request, response, *args, **kwargs)
        audit_api_request(request, response)
        return response

    def audit_detail(self, **facts: Any) -> None:
        """Facts for this request's audit entry (e.g. a role change's old and new role)."""
        current = getattr(self.request, "_epochal_audit_detail", {})
        self.request._epochal_audit_detail = {**current, **facts}  # type: ignore[attr-defined]

    def remember_operation(self, operation: Any) -> None:
        """Link this request's audit entry to `operation`."""
        self.request._epochal_operation = operation  # type: ignore[attr-defined]
