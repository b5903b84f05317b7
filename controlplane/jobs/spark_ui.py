"""The Spark UI of a job's run, reached through the control plane at ``/jobs/<name>/spark-ui/``.

A job's driver serves Spark's own UI (on by default; an admin turns it off per version with
``spark.ui.enabled: "false"``). The control plane launches every run with Spark's
``spark.ui.proxyBase`` set to the job's proxy path, so the UI's links point back through the
proxy, and with ``spark.ui.killEnabled`` off, so a viewer cannot kill stages through it.

The driver reports where its UI bound in its `started` event; `record_spark_ui` reads it from
the run's log and keeps it on the run only when it is where this run's driver can be: a
loopback address for a local run, the driver Service's UI port for a Kubernetes run. The proxy
then only ever connects to that recorded address (no open relay), and only with a relative
path of the UI (`upstream_path`).
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from collections.abc import Callable
from typing import Final

from django.conf import settings

from controlplane.errors import InvalidRequest, NotFound
from controlplane.jobs.events import engine_event
from controlplane.jobs.models import Job, Run, RunPhase
from runners.job_spec import JobSpec
from runners.kubernetes import manifests

#: how many of a run's last log lines are searched for its `started` event
_LOG_LINES: Final = 2000
_LOOPBACK_NAMES: Final = frozenset({"localhost", "localhost.localdomain"})
#: characters a path of the UI keeps unescaped in the request to the driver
_PATH_SAFE: Final = "/-_.~!$&'()*+,;=:@"
_CONTROL: Final = re.compile(r"[\x00-\x20\x7f]")


def proxy_path(job_name: str) -> str:
    """The job's Spark UI in the control plane (``/jobs/<name>/spark-ui``, no trailing /)."""
    return f"/jobs/{job_name}/spark-ui"


def spark_ui_link(job_name: str, base: str | None = None) -> str:
    """The proxy's address for people: `base`, by default `EPOCHAL_URL` (where the control
    plane is served, default the demo's ``http://127.0.0.1:8000``), and the job's path."""
    base = base or settings.EPOCHAL_URL
    return f"{base.rstrip('/')}{proxy_path(job_name)}/"


def run_spark_ui_text(run: Run | None, base: str | None = None) -> str:
    """Where a run's Spark UI stands, for a person: the link, or why there is none."""
    if run is None or run.phase != RunPhase.RUNNING:
        return "none (no running run)"
    if run.spark_ui_url is None:
        return "not reported yet (the driver is starting)"
    if not run.spark_ui_url:
        return "off (the version sets spark.ui.enabled to false)"
    return spark_ui_link(run.job.name, base)


def spark_ui_conf(job_name: str) -> dict[str, str]:
    """The Spark settings every run of the job gets under the version's own."""
    return {"spark.ui.proxyBase": proxy_path(job_name), "spark.ui.killEnabled": "false"}


def reported_address(log_text: str) -> str | None:
    """The `spark_ui` of the driver's `started` event in `log_text`: the address, "" when
    the UI is off, None when the log holds no `started` event (yet)."""
    for line in log_text.splitlines():
        event = engine_event(line) if '"started"' in line else None
        if event is not None and event["event"] == "started":
            return str(event.get("spark_ui") or "")
    return None


def _is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return bool(settings.SPARK_LOCAL_IP) and host == settings.SPARK_LOCAL_IP


def address_problem(run: Run, address: str) -> str:
    """What is wrong with `address` as the UI of `run` ("" when the proxy may connect to it)."""
    parts = urllib.parse.urlsplit(address)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None:
        return f"{address!r} is not http://HOST:PORT"
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        return f"{address!r} has more than a host and a port"
    if run.runner == "kubernetes":
        handle = run.handle or {}
        service = (
            f"{manifests.service_name(JobSpec.from_dict(run.spec))}.{handle.get('location')}.svc"
        )
        if parts.hostname != service or port != manifests.UI_PORT:
            return (
                f"{address!r} is not the driver Service's UI port ({service}:{manifests.UI_PORT})"
            )
        return ""
    if not _is_loopback(parts.hostname):
        return (
            f"{address!r} is not on this machine (a local run's UI listens on a loopback address)"
        )
    return ""


def record_spark_ui(run: Run, logs: Callable[[int], str]) -> Run:
    """Keep the UI address the running `run` reported in its log (`logs(tail_lines)`), once
    per run: the log is read only until the driver's `started` event is found."""
    if run.spark_ui_url is not None or run.phase != RunPhase.RUNNING:
        return run
    address = reported_address(logs(_LOG_LINES))
    if address is None:
        return run
    if address and address_problem(run, address):
        address = ""  # never proxied: the job page says the run has no UI
    run.spark_ui_url = address.rstrip("/")
    run.save(update_fields=["spark_ui_url"])
    return run


def upstream_path(rest: str, query: str = "") -> str:
    """The request target on the driver for the UI path `rest` (what follows
    ``/spark-ui/``): a relative path without ``.``/``..`` segments, nothing absolute."""
    problem = ""
    if rest.startswith("/") or "\\" in rest:
        problem = "an absolute path"
    elif "://" in rest or re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", rest):
        problem = "an absolute URL"
    elif any(segment in (".", "..") for segment in rest.split("/")):
        problem = "a '.' or '..' segment"
    elif _CONTROL.search(rest):
        problem = "a space or control character"
    if problem:
        raise InvalidRequest(
            f"the Spark UI path {rest!r} is refused: it has {problem}; the proxy only serves "
            "paths of the run's own UI, e.g. /jobs/<name>/spark-ui/stages/",
            code="spark_ui_path_refused",
            fields={"path": [f"must be a relative path of the Spark UI, not {problem}"]},
        )
    target = "/" + urllib.parse.quote(rest, safe=_PATH_SAFE)
    return f"{target}?{query}" if query else target


def spark_ui_address(job: Job) -> tuple[Run, str]:
    """The job's running run and its recorded UI address; NotFound saying why otherwise."""
    run = job.runs.filter(phase=RunPhase.RUNNING).order_by("-created_at").first()
    if run is None:
        raise NotFound(
            f"job {job.name} has no running run, so no Spark UI: start it "
            f"(`epochal start {job.name}`)",
            code="spark_ui_not_running",
        )
    if run.spark_ui_url is None:
        raise NotFound(
            f"run {run.run_id} of job {job.name} has not reported its Spark UI yet (its driver "
            "is starting): try again in a few seconds",
            code="spark_ui_not_yet",
        )
    if not run.spark_ui_url or address_problem(run, run.spark_ui_url):
        raise NotFound(
            f"run {run.run_id} of job {job.name} has no Spark UI: its version turns it off "
            '(spark_conf "spark.ui.enabled": "false") or its driver reported no usable address',
            code="spark_ui_off",
        )
    return run, run.spark_ui_url


def rewrite_location(location: str, address: str, job_name: str) -> str:
    """A redirect of the driver's UI as a path through the proxy (Spark's redirects name
    the driver's own address); a redirect anywhere else becomes the UI's start page."""
    base = proxy_path(job_name)
    parts = urllib.parse.urlsplit(location)
    own = urllib.parse.urlsplit(address)
    if (parts.scheme or parts.netloc) and (parts.scheme, parts.netloc) != (
        own.scheme,
        own.netloc,
    ):
        return f"{base}/"
    path = parts.path or "/"
    if not path.startswith("/"):
        return location  # relative to the current page: already through the proxy
    if not (path == base or path.startswith(f"{base}/")):
        path = base + path
    return path + (f"?{parts.query}" if parts.query else "")
