"""The authenticated reverse proxy to a running job's Spark UI: ``/jobs/<name>/spark-ui/…``.

Viewers and up; GET and HEAD only (the runs' UIs cannot kill anything: `spark.ui.killEnabled`
is off). The proxy connects only to the address recorded with the job's running run and asks
it only for relative paths of the UI (`controlplane.jobs.spark_ui`); the user's cookies and
credentials are never passed on.
"""

from __future__ import annotations

import http.client
import urllib.parse
from collections.abc import Iterator
from typing import Final

from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, StreamingHttpResponse
from django.views.decorators.clickjacking import xframe_options_sameorigin

from controlplane.jobs.selectors import job_get
from controlplane.jobs.spark_ui import rewrite_location, spark_ui_address, upstream_path
from web.access import viewer_required
from web.views.base import domain_errors, error_page

TIMEOUT_S: Final = 15.0
_CHUNK: Final = 64 * 1024
#: request headers passed to the driver (nothing that identifies the user)
_FORWARDED_REQUEST: Final = ("Accept", "Accept-Language", "If-Modified-Since", "If-None-Match")
#: response headers passed back
_FORWARDED_RESPONSE: Final = (
    "Content-Type",
    "Cache-Control",
    "Content-Security-Policy",
    "ETag",
    "Last-Modified",
    "Expires",
)


def _body(
    response: http.client.HTTPResponse, connection: http.client.HTTPConnection
) -> Iterator[bytes]:
    try:
        while chunk := response.read(_CHUNK):
            yield chunk
    finally:
        connection.close()


@xframe_options_sameorigin
@viewer_required
@domain_errors
def spark_ui(request: HttpRequest, name: str, rest: str = "") -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        return HttpResponseNotAllowed(["GET", "HEAD"], "the Spark UI is read-only here")
    job = job_get(name=name)
    target = upstream_path(rest, request.META.get("QUERY_STRING", ""))
    run, address = spark_ui_address(job)
    parts = urllib.parse.urlsplit(address)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=TIMEOUT_S)
    headers = {k: v for k in _FORWARDED_REQUEST if (v := request.headers.get(k))}
    try:
        connection.request(request.method or "GET", target, headers=headers)
        upstream = connection.getresponse()
    except OSError as exc:
        connection.close()
        return error_page(
            request,
            f"the Spark UI of run {run.run_id} at {address} is not answering ({exc}); the run "
            "may be ending — the job page shows its state",
            status=502,
        )
    out = StreamingHttpResponse(_body(upstream, connection), status=upstream.status)
    for header in _FORWARDED_RESPONSE:
        value = upstream.getheader(header)
        if value is not None:
            out[header] = value
    location = upstream.getheader("Location")
    if location is not None:
        out["Location"] = rewrite_location(location, address, job.name)
    return out
