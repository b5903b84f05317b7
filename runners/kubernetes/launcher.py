"""KubernetesLauncher: a run is a driver Pod (+ Service + ConfigMap) made with the official client.

Every API call goes through `KubernetesLauncher._call`, which allows only the verbs listed in
`RBAC_RULES` — the same list the Helm chart grants the control plane's ServiceAccount (a test
compares them) — retries 429/5xx and connection errors with exponential back-off, and turns
403 into a `KubernetesForbiddenError` that names the verb and resource.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from runners.config import RunnersConfig
from runners.job_spec import JobSpec
from runners.kubernetes import manifests
from runners.kubernetes.manifests import Placement
from runners.launcher import (
    LauncherError,
    RunHandle,
    RunPhase,
    RunStatus,
    request_stop,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class RbacRule:
    api_group: str
    resource: str
    verbs: tuple[str, ...]


RBAC_RULES: Final[tuple[RbacRule, ...]] = (
    RbacRule("", "pods", ("create", "delete", "get")),
    RbacRule("", "pods/log", ("get",)),
    RbacRule("", "services", ("create", "delete", "get")),
    RbacRule("", "configmaps", ("create", "delete", "get")),
)
"""Exactly what the launcher does with the API (the control plane's Role in helm/epochal)."""

SPARK_DRIVER_RBAC_RULES: Final[tuple[RbacRule, ...]] = (
    RbacRule("", "pods", ("create", "delete", "deletecollection", "get", "list", "watch")),
    RbacRule("", "configmaps", ("create", "delete", "deletecollection", "get", "list")),
    RbacRule("", "persistentvolumeclaims", ("deletecollection", "get", "list")),
)
"""What Spark's scheduler in the driver Pod does with the API (the job ServiceAccount's Role)."""

_ALLOWED: Final = {(rule.resource, verb) for rule in RBAC_RULES for verb in rule.verbs}
_RETRYABLE_STATUS: Final = {429, 500, 502, 503, 504}
_SA_NAMESPACE_FILE: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class KubernetesForbiddenError(LauncherError):
    """RBAC refused a call; the message names the verb, resource and namespace."""

    def __init__(self, verb: str, resource: str, namespace: str, detail: str) -> None:
        self.verb, self.resource, self.namespace = verb, resource, namespace
        super().__init__(
            f"Kubernetes refused to {verb} {resource} in namespace {namespace} (403 Forbidden): "
            f"{detail}. Grant the control plane's ServiceAccount the verbs in "
            f"runners.kubernetes.RBAC_RULES (the Helm chart's Role does)."
        )


class KubernetesApiError(LauncherError):
    """The API server kept failing, or answered something the launcher cannot handle."""


def _status_detail(exc: ApiException) -> str:
    import json

    try:
        body = json.loads(exc.body or "{}")
    except ValueError:
        body = {}
    return str(body.get("message") or exc.reason or f"HTTP {exc.status}")


class KubernetesLauncher:
    """Launches runs into one Kubernetes namespace. See the module docstring."""

    name = "kubernetes"

    def __init__(
        self,
        *,
        namespace: str,
        image: str | None,
        service_account: str = "epochal-spark",
        api_client: client.ApiClient | None = None,
        master: str = manifests.IN_CLUSTER_MASTER,
        store_credentials_secret: str | None = None,
        image_pull_secrets: tuple[str, ...] = (),
        kill_grace_s: int = 30,
        poll_interval_s: float = 1.0,
        retries: int = 5,
        backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        in_cluster: bool = False,
        kubeconfig: str | None = None,
    ) -> None:
        #: how the API client finds the cluster: the pod's service account, or a kubeconfig
        #: file (None: the Kubernetes client's default)
        self.in_cluster = in_cluster
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.image = image
        self.service_account = service_account
        self.master = master
        self.store_credentials_secret = store_credentials_secret
        self.image_pull_secrets = image_pull_secrets
        self.kill_grace_s = kill_grace_s
        self.poll_interval_s = poll_interval_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._api_client = api_client

    @classmethod
    def from_config(cls, settings: RunnersConfig) -> KubernetesLauncher:
        """Configured by the Helm chart's settings; in-cluster credentials are used lazily."""
        namespace = settings.k8s_namespace or ""
        if not namespace and _SA_NAMESPACE_FILE.exists():
            namespace = _SA_NAMESPACE_FILE.read_text().strip()
        pull_secrets = settings.image_pull_secrets
        return cls(
            namespace=namespace or "default",
            image=settings.image,
            service_account=settings.job_service_account or "epochal-spark",
            store_credentials_secret=settings.store_credentials_secret,
            image_pull_secrets=tuple(s.strip() for s in pull_secrets.split(",") if s.strip()),
            in_cluster=settings.in_cluster,
            kubeconfig=settings.kubeconfig,
        )

    # -- plumbing -------------------------------------------------------------------------

    @property
    def core(self) -> client.CoreV1Api:
        if self._api_client is None:
            if self.in_cluster:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
            else:
                # KUBECONFIG as the launcher was set up with, not when the library was imported
                config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=self.kubeconfig
                )
            self._api_client = client.ApiClient()
        return client.CoreV1Api(self._api_client)

    def _call(self, verb: str, resource: str, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """One API call with the RBAC check, back-off on 429/5xx/connection errors, 403 mapping."""
        if (resource, verb) not in _ALLOWED:
            raise AssertionError(f"{verb} {resource} is not in RBAC_RULES; add it there first")
        attempt = 0
        while True:
            try:
                return fn(*args, **kw)
            except ApiException as exc:
                if exc.status == 403:
                    raise KubernetesForbiddenError(
                        verb, resource, self.namespace, _status_detail(exc)
                    ) from None
                if exc.status not in _RETRYABLE_STATUS or attempt >= self.retries:
                    raise
                problem = f"HTTP {exc.status} {_status_detail(exc)}"
            except (urllib3.exceptions.HTTPError, ConnectionError) as exc:
                if attempt >= self.retries:
                    raise KubernetesApiError(
                        f"cannot reach the Kubernetes API to {verb} {resource} "
                        f"after {attempt + 1} attempts: {exc}"
                    ) from exc
                problem = str(exc)
            delay = min(self.max_backoff_s, self.backoff_s * 2**attempt)
            delay *= random.uniform(0.5, 1.0)
            log.warning("%s %s failed (%s); retrying in %.2f s", verb, resource, problem, delay)
            time.sleep(delay)
            attempt += 1

    def _create(
        self,
        resource: str,
        create: Callable[..., Any],
        body: dict[str, Any],
        read: Callable[..., Any],
    ) -> dict[str, Any]:
        """Create `body`, or return the existing object if this run already created it."""
        name = body["metadata"]["name"]
        try:
            created = self._call(
                "create", resource, create, self.namespace, body, _preload_content=False
            )
            return _json(created)
        except ApiException as exc:
            if exc.status != 409:
                raise KubernetesApiError(
                    f"cannot create {resource} {name} in {self.namespace}: "
                    f"HTTP {exc.status} {_status_detail(exc)}"
                ) from None
        existing = _json(
            self._call("get", resource, read, name, self.namespace, _preload_content=False)
        )
        run = existing.get("metadata", {}).get("labels", {}).get(manifests.LABEL_RUN)
        if run != body["metadata"]["labels"][manifests.LABEL_RUN]:
            raise KubernetesApiError(
                f"{resource} {name} already exists in {self.namespace} and belongs to run "
                f"{run!r}, not {body['metadata']['labels'][manifests.LABEL_RUN]!r}; delete it "
                f"or start with a new run id"
            )
        return existing

    def _delete(self, resource: str, delete: Callable[..., Any], name: str, **kw: Any) -> None:
        try:
            self._call("delete", resource, delete, name, self.namespace, **kw)
        except ApiException as exc:
            if exc.status != 404:
                raise KubernetesApiError(
                    f"cannot delete {resource} {name} in {self.namespace}: "
                    f"HTTP {exc.status} {_status_detail(exc)}"
                ) from None

    def placement(self, spec: JobSpec) -> Placement:
        image = spec.image or self.image
        if image is None:
            raise LauncherError(
                "no container image for the job: set EPOCHAL_IMAGE (the Helm chart does) "
                "or the application's image"
            )
        return Placement(
            namespace=self.namespace,
            image=image,
            service_account=spec.service_account or self.service_account,
            master=self.master,
            termination_grace_s=self.kill_grace_s,
        )

    def _complete(self, spec: JobSpec) -> JobSpec:
        """Fill the launcher's defaults (image, credentials, pull secrets) into the spec."""
        from dataclasses import replace

        return replace(
            spec,
            image=spec.image or self.image,
            service_account=spec.service_account or self.service_account,
            store_credentials_secret=spec.store_credentials_secret or self.store_credentials_secret,
            image_pull_secrets=spec.image_pull_secrets or self.image_pull_secrets,
        )

    # -- Launcher -------------------------------------------------------------------------

    def start(self, spec: JobSpec) -> RunHandle:
        placement = self.placement(spec)
        spec = self._complete(spec)
        if spec.store_credentials_env and not spec.store_credentials_secret:
            raise LauncherError(
                f"the job's store takes its credentials from ${spec.store_credentials_env}_AWS_* "
                "in the control plane's environment, which cannot reach a pod without writing "
                "the secret into its spec: give the store a Kubernetes secret (credentials_secret, "
                "holding AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY) or set "
                "EPOCHAL_STORE_CREDENTIALS_SECRET"
            )
        unmounted = sorted(set(spec.sink_credentials_env) - set(spec.sink_secrets))
        if unmounted:
            sink = unmounted[0]
            raise LauncherError(
                f"sink {sink!r} takes its credentials from ${spec.sink_credentials_env[sink]} in "
                "the control plane's environment, which cannot reach a pod without writing the "
                "secret into its spec: an admin gives the sink a Kubernetes secret holding that "
                "variable (credentials_secret)"
            )
        if spec.store_url.startswith("file:"):
            log.warning(
                "run %s uses a file store (%s): every Pod sees its own filesystem; "
                "use an S3-compatible STORE_URL on Kubernetes",
                spec.run_id,
                spec.store_url,
            )
        core = self.core
        pod = self._create(
            "pods",
            core.create_namespaced_pod,
            manifests.driver_pod(spec, placement),
            core.read_namespaced_pod,
        )
        self._create(
            "configmaps",
            core.create_namespaced_config_map,
            manifests.job_config_map(spec, placement, pod),
            core.read_namespaced_config_map,
        )
        self._create(
            "services",
            core.create_namespaced_service,
            manifests.driver_service(spec, placement, pod),
            core.read_namespaced_service,
        )
        log.info("started run %s: pod %s/%s", spec.run_id, self.namespace, pod["metadata"]["name"])
        return RunHandle.for_spec(spec, runner=self.name, location=self.namespace)

    def _names(self, handle: RunHandle) -> tuple[str, str, str]:
        spec = JobSpec(
            application=handle.application,
            namespace=handle.namespace,
            branch=handle.branch,
            store_url=handle.store_url,
            job="unused",  # names only: the job is not loaded here
            parallelism=1,
            run_id=handle.run_id,
        )
        return (
            manifests.driver_pod_name(spec),
            manifests.service_name(spec),
            manifests.config_map_name(spec),
        )

    def _read_pod(self, handle: RunHandle) -> dict[str, Any] | None:
        pod_name = self._names(handle)[0]
        try:
            return _json(
                self._call(
                    "get",
                    "pods",
                    self.core.read_namespaced_pod,
                    pod_name,
                    handle.location,
                    _preload_content=False,
                )
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise KubernetesApiError(
                f"cannot read pod {pod_name} in {handle.location}: "
                f"HTTP {exc.status} {_status_detail(exc)}"
            ) from None

    def status(self, handle: RunHandle) -> RunStatus:
        pod = self._read_pod(handle)
        if pod is None:
            return RunStatus(
                phase=RunPhase.FAILED,
                reason=f"driver pod {self._names(handle)[0]} not found in {handle.location} "
                f"(deleted, or the run was cleaned up)",
            )
        return pod_status(pod)

    def stop(self, handle: RunHandle, deadline_s: float) -> RunStatus:
        status = self.status(handle)
        if status.finished:
            return status
        try:
            request_stop(handle, reason=f"stop with a {deadline_s:g} s deadline")
        except Exception as exc:  # the store may be unreachable from here: fall through
            log.warning("run %s: could not write the stop request (%s)", handle.run_id, exc)
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            time.sleep(self.poll_interval_s)
            status = self.status(handle)
            if status.finished:
                return status
        pod_name = self._names(handle)[0]
        log.warning(
            "run %s: still running at the stop deadline, deleting %s", handle.run_id, pod_name
        )
        self._delete(
            "pods",
            self.core.delete_namespaced_pod,
            pod_name,
            grace_period_seconds=self.kill_grace_s,
        )
        return RunStatus(
            phase=RunPhase.FAILED,
            reason=f"driver pod deleted at the {deadline_s:g} s stop deadline "
            f"(SIGTERM, then SIGKILL after {self.kill_grace_s} s)",
        )

    def cleanup(self, handle: RunHandle) -> None:
        pod_name, svc_name, cm_name = self._names(handle)
        core = self.core
        self._delete(
            "pods",
            core.delete_namespaced_pod,
            pod_name,
            grace_period_seconds=0,
            propagation_policy="Background",
        )
        self._delete("services", core.delete_namespaced_service, svc_name)
        self._delete("configmaps", core.delete_namespaced_config_map, cm_name)

    def logs(self, handle: RunHandle, tail_lines: int = 100) -> str:
        pod_name = self._names(handle)[0]
        try:
            response: Any = self._call(
                "get",
                "pods/log",
                self.core.read_namespaced_pod_log,
                pod_name,
                handle.location,
                container=manifests.DRIVER_CONTAINER,
                tail_lines=tail_lines,
                _preload_content=False,
            )
        except ApiException as exc:
            if exc.status in (400, 404):  # not started yet, or gone
                return ""
            raise
        return str(response.data.decode("utf-8", errors="replace"))


def _json(response: Any) -> dict[str, Any]:
    """The body of a `_preload_content=False` response as a dict (camelCase, as on the wire)."""
    import json

    data = json.loads(response.data or b"{}")
    if not isinstance(data, dict):
        raise KubernetesApiError(f"unexpected API response: {str(data)[:200]}")
    return data


def pod_status(pod: dict[str, Any]) -> RunStatus:
    """Launcher phase and reason from a driver Pod's status."""
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    containers = status.get("containerStatuses") or []
    driver = next(
        (c for c in containers if c.get("name") == manifests.DRIVER_CONTAINER),
        containers[0] if containers else {},
    )
    state = driver.get("state") or {}
    if phase == "Succeeded":
        return RunStatus(phase=RunPhase.SUCCEEDED, exit_code=0)
    if phase == "Failed":
        terminated = state.get("terminated") or {}
        code = terminated.get("exitCode")
        why = terminated.get("reason") or status.get("reason") or "Failed"
        message = terminated.get("message") or status.get("message") or ""
        reason = f"{why} (exit code {code})" if code is not None else why
        if message:
            reason += f": {message.strip()}"
        return RunStatus(phase=RunPhase.FAILED, reason=reason, exit_code=code)
    if phase == "Running":
        return RunStatus(phase=RunPhase.RUNNING)
    if phase == "Unknown":
        return RunStatus(
            phase=RunPhase.PENDING,
            reason="Unknown: the node of the driver pod stopped reporting",
        )
    waiting = state.get("waiting") or {}
    if waiting.get("reason"):
        reason = waiting["reason"]
        if waiting.get("message"):
            reason += f": {waiting['message']}"
        return RunStatus(phase=RunPhase.PENDING, reason=reason)
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            reason = condition.get("reason") or "Unschedulable"
            if condition.get("message"):
                reason += f": {condition['message']}"
            return RunStatus(phase=RunPhase.PENDING, reason=reason)
    return RunStatus(phase=RunPhase.PENDING, reason="waiting to be scheduled")


__all__ = [
    "RBAC_RULES",
    "SPARK_DRIVER_RBAC_RULES",
    "KubernetesApiError",
    "KubernetesForbiddenError",
    "KubernetesLauncher",
    "RbacRule",
    "pod_status",
]
