"""The Kubernetes objects of one job run, as plain dicts (what goes over the wire).

One run = a driver Pod running `python -m runners.engine.main` with Spark in client mode
against the in-cluster API server, a headless Service so executors reach the driver by a
stable name, and a ConfigMap with the job spec and the executor pod template. Spark's own
Kubernetes scheduler creates the executor Pods and makes the driver Pod their owner; the
Service and ConfigMap are owned by the driver Pod too, so deleting the driver removes the run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import yaml

from runners.job_spec import ENGINE_MODULE, JobSpec, memory_with_overhead_mb
from runners.launcher import RUN_ID_ENV, pyspark_submit_args

IN_CLUSTER_MASTER: Final = "k8s://https://kubernetes.default.svc"
DRIVER_CONTAINER: Final = "spark-driver"
EXECUTOR_CONTAINER: Final = "spark-executor"
DRIVER_PORT: Final = 7078
BLOCK_MANAGER_PORT: Final = 7079
UI_PORT: Final = 4040
"""The Spark UI's port in the driver Pod and on its Service (the control plane proxies it)."""
CONFIG_MOUNT: Final = "/etc/epochal"
SPEC_FILE: Final = "job-spec.json"
EXECUTOR_TEMPLATE_FILE: Final = "executor-pod-template.yaml"

LABEL_RUN: Final = "epochal.io/run-id"
LABEL_APPLICATION: Final = "epochal.io/application"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
ANNOTATION_BRANCH: Final = "epochal.io/branch"
ANNOTATION_NAMESPACE: Final = "epochal.io/namespace"
ANNOTATION_APPLICATION: Final = "epochal.io/application"


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where and as whom a run executes (the launcher's configuration, completed per spec)."""

    namespace: str
    image: str
    service_account: str
    master: str = IN_CLUSTER_MASTER
    image_pull_policy: str = "IfNotPresent"
    termination_grace_s: int = 30


def _slug(text: str, limit: int) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if not slug or not slug[0].isalpha():
        slug = f"app-{slug}".rstrip("-")
    return slug[:limit].rstrip("-")


def run_name(spec: JobSpec) -> str:
    """`<application slug>-<run id>`: at most 41 characters (Spark allows 47 for the prefix)."""
    return f"{_slug(spec.application, 28)}-{spec.run_id[:12]}"


def driver_pod_name(spec: JobSpec) -> str:
    return f"{run_name(spec)}-driver"


def service_name(spec: JobSpec) -> str:
    return f"{run_name(spec)}-driver-svc"


def config_map_name(spec: JobSpec) -> str:
    return f"{run_name(spec)}-spec"


def run_labels(spec: JobSpec, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "epochal-job",
        "app.kubernetes.io/managed-by": "epochal",
        LABEL_COMPONENT: component,
        LABEL_APPLICATION: _slug(spec.application, 63),
        LABEL_RUN: spec.run_id,
    }


def run_annotations(spec: JobSpec) -> dict[str, str]:
    return {
        ANNOTATION_APPLICATION: spec.application,
        ANNOTATION_NAMESPACE: spec.namespace,
        ANNOTATION_BRANCH: spec.branch,
    }


def spark_conf(spec: JobSpec, placement: Placement) -> dict[str, str]:
    """The Spark configuration of the driver; ours override the spec's `spark_conf`."""
    resources = spec.resources
    conf = dict(spec.spark_conf)
    conf.update(
        {
            "spark.app.name": spec.application,
            "spark.submit.deployMode": "client",
            "spark.kubernetes.namespace": placement.namespace,
            "spark.kubernetes.container.image": spec.image or placement.image,
            "spark.kubernetes.container.image.pullPolicy": placement.image_pull_policy,
            "spark.kubernetes.driver.pod.name": driver_pod_name(spec),
            "spark.kubernetes.executor.podNamePrefix": run_name(spec),
            "spark.kubernetes.authenticate.executor.serviceAccountName": (
                spec.service_account or placement.service_account
            ),
            "spark.kubernetes.executor.podTemplateFile": (
                f"{CONFIG_MOUNT}/{EXECUTOR_TEMPLATE_FILE}"
            ),
            "spark.kubernetes.executor.podTemplateContainerName": EXECUTOR_CONTAINER,
            "spark.kubernetes.executor.deleteOnTermination": "true",
            "spark.driver.host": f"{service_name(spec)}.{placement.namespace}.svc",
            # Spark 4.1+ defaults executors to the driver's bind address (0.0.0.0 here):
            # they must dial the headless Service instead.
            "spark.kubernetes.executor.useDriverPodIP": "false",
            "spark.driver.bindAddress": "0.0.0.0",
            "spark.driver.port": str(DRIVER_PORT),
            "spark.driver.blockManager.port": str(BLOCK_MANAGER_PORT),
            "spark.ui.port": str(UI_PORT),
            "spark.executor.instances": str(resources.executor_count(spec.parallelism)),
            "spark.executor.cores": str(resources.executor_cores),
            "spark.executor.memory": f"{resources.executor_memory_mb}m",
            "spark.default.parallelism": str(spec.parallelism),
            f"spark.executorEnv.{RUN_ID_ENV}": spec.run_id,
        }
    )
    if spec.image_pull_secrets:
        conf["spark.kubernetes.container.image.pullSecrets"] = ",".join(spec.image_pull_secrets)
    for key, value in run_labels(spec, "spark-executor").items():
        conf[f"spark.kubernetes.executor.label.{key}"] = value
    for key, value in spec.node_selector.items():
        conf[f"spark.kubernetes.executor.node.selector.{key}"] = value
    return conf


def driver_environment(spec: JobSpec, placement: Placement) -> dict[str, str]:
    """Plain environment of the driver container (credentials come from a Secret, never here)."""
    return {
        "SPARK_MASTER": placement.master,
        "PYSPARK_SUBMIT_ARGS": pyspark_submit_args(
            placement.master, spark_conf(spec, placement), spec.resources.driver_memory_mb
        ),
        RUN_ID_ENV: spec.run_id,
        "STORE_URL": spec.store_url,
        "PYTHONUNBUFFERED": "1",
    }


def _credentials(spec: JobSpec) -> list[dict[str, Any]]:
    """The Secrets the job's containers take their environment from: the store's, then each
    sink's (once each, in sink order)."""
    store = [] if spec.store_credentials_secret is None else [spec.store_credentials_secret]
    names = dict.fromkeys([*store, *spec.sink_secrets.values()])
    return [{"secretRef": {"name": name}} for name in names]


def executor_pod_template(spec: JobSpec) -> dict[str, Any]:
    """What Spark's conf cannot say about executors: tolerations, store and sink credentials."""
    container: dict[str, Any] = {"name": EXECUTOR_CONTAINER}
    if credentials := _credentials(spec):
        container["envFrom"] = credentials
    pod_spec: dict[str, Any] = {"containers": [container]}
    if spec.tolerations:
        pod_spec["tolerations"] = [t.to_kubernetes() for t in spec.tolerations]
    return {"apiVersion": "v1", "kind": "Pod", "spec": pod_spec}


def driver_pod(spec: JobSpec, placement: Placement) -> dict[str, Any]:
    resources = spec.resources
    memory = f"{memory_with_overhead_mb(resources.driver_memory_mb)}Mi"
    container: dict[str, Any] = {
        "name": DRIVER_CONTAINER,
        "image": spec.image or placement.image,
        "imagePullPolicy": placement.image_pull_policy,
        # args, not command: the image entry point runs it under tini (signals, zombies).
        "args": ["python", "-m", ENGINE_MODULE, *spec.engine_arguments()],
        "env": [
            {"name": key, "value": value}
            for key, value in driver_environment(spec, placement).items()
        ],
        "ports": [
            {"name": "driver-rpc", "containerPort": DRIVER_PORT, "protocol": "TCP"},
            {"name": "blockmanager", "containerPort": BLOCK_MANAGER_PORT, "protocol": "TCP"},
            {"name": "spark-ui", "containerPort": UI_PORT, "protocol": "TCP"},
        ],
        "resources": {
            "requests": {"cpu": str(resources.driver_cores), "memory": memory},
            "limits": {"memory": memory},
        },
        "volumeMounts": [{"name": "job-spec", "mountPath": CONFIG_MOUNT, "readOnly": True}],
    }
    if credentials := _credentials(spec):
        container["envFrom"] = credentials
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": spec.service_account or placement.service_account,
        "terminationGracePeriodSeconds": placement.termination_grace_s,
        "containers": [container],
        "volumes": [{"name": "job-spec", "configMap": {"name": config_map_name(spec)}}],
    }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [t.to_kubernetes() for t in spec.tolerations]
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in spec.image_pull_secrets]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": driver_pod_name(spec),
            "namespace": placement.namespace,
            "labels": run_labels(spec, "spark-driver"),
            "annotations": run_annotations(spec),
        },
        "spec": pod_spec,
    }


def owner_reference(pod: Mapping[str, Any]) -> dict[str, Any]:
    """Makes an object garbage-collected with the driver Pod (needs the Pod's server uid)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": pod["metadata"]["name"],
        "uid": pod["metadata"]["uid"],
        "controller": True,
    }


def driver_service(spec: JobSpec, placement: Placement, owner: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(spec),
            "namespace": placement.namespace,
            "labels": run_labels(spec, "spark-driver"),
            "annotations": run_annotations(spec),
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": {
            "clusterIP": "None",
            "selector": {LABEL_RUN: spec.run_id, LABEL_COMPONENT: "spark-driver"},
            "ports": [
                {"name": "driver-rpc", "port": DRIVER_PORT, "targetPort": DRIVER_PORT},
                {
                    "name": "blockmanager",
                    "port": BLOCK_MANAGER_PORT,
                    "targetPort": BLOCK_MANAGER_PORT,
                },
                {"name": "spark-ui", "port": UI_PORT, "targetPort": UI_PORT},
            ],
        },
    }


def job_config_map(spec: JobSpec, placement: Placement, owner: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": config_map_name(spec),
            "namespace": placement.namespace,
            "labels": run_labels(spec, "spark-driver"),
            "annotations": run_annotations(spec),
            "ownerReferences": [owner_reference(owner)],
        },
        "data": {
            SPEC_FILE: json.dumps(spec.to_dict(), indent=2, sort_keys=True),
            EXECUTOR_TEMPLATE_FILE: yaml.safe_dump(executor_pod_template(spec), sort_keys=False),
        },
    }
