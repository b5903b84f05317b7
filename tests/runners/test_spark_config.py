"""Spark itself accepts the driver Pod's configuration and asks the API server for executors.

The driver Pod's environment (PYSPARK_SUBMIT_ARGS with every Spark conf, SPARK_MASTER) is
taken from the Pod the launcher created in the API double; only the master URL (the double
instead of kubernetes.default.svc), the template path (the ConfigMap's file, written locally)
and the bind address change. Spark then runs its Kubernetes scheduler in client mode against
the double: it reads its driver Pod and creates executor Pods owned by it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from runners.job_spec import JobSpec, Resources, Toleration
from runners.kubernetes import SPARK_DRIVER_RBAC_RULES, KubernetesLauncher
from runners.local import PROJECT_ROOT, group_members
from tests.conftest import require_service
from tests.runners.kube_double import RunningDouble, api_server_double

NS = "streaming"
IMAGE = "registry.example.com/epochal:1.4.0"
POD = "orders-app-5b7c9d1e2f3a-driver"


def verb_of(request: Any) -> tuple[str, str]:
    """(resource, RBAC verb) of a request to /api/v1/namespaces/<ns>/<resource>[/<name>]."""
    parts = request.url.path.split("/")[5:]
    resource, named = parts[0], len(parts) > 1
    method = request.method.value
    if method == "GET":
        verb = "get" if named else ("watch" if request.params.get("watch") == "true" else "list")
    elif method == "DELETE":
        verb = "delete" if named else "deletecollection"
    else:
        verb = {"POST": "create", "PATCH": "patch", "PUT": "update"}[method]
    return resource, verb


def spark_requests(api: RunningDouble) -> list[Any]:
    return [r for r in list(api.k[:]) if "fabric8" in (r.headers.get("User-Agent") or "")]


def executor_posts(api: RunningDouble) -> list[Any]:
    return [
        r
        for r in spark_requests(api)
        if r.method.value == "POST" and r.url.path == f"/api/v1/namespaces/{NS}/pods"
    ]


@pytest.mark.spark
def test_spark_accepts_the_generated_configuration_and_requests_executors(tmp_path: Path) -> None:
    require_service("Java", shutil.which("java") is not None, "install OpenJDK 17")
    spec = JobSpec(
        application="Orders App",
        namespace="orders",
        branch="main",
        store_url="s3://epochal-store/prod?endpoint_url=http://minio:9000",
        job="fraud",
        parallelism=3,
        run_id="5b7c9d1e2f3a",
        resources=Resources(executor_cores=2, executor_memory_mb=1024),
        node_selector={"pool": "spark"},
        tolerations=(Toleration(key="dedicated", value="spark", effect="NoSchedule"),),
        image_pull_secrets=("regcred",),
        store_credentials_secret="epochal-store",
    )
    with api_server_double() as api:
        launcher = KubernetesLauncher(namespace=NS, image=IMAGE, api_client=api.api_client())
        launcher.start(spec)
        pod = api.object("pods", NS, POD)
        config_map = api.object("configmaps", NS, "orders-app-5b7c9d1e2f3a-spec")
        assert pod is not None and config_map is not None
        # The kubelet would run the Pod and report it ready; Spark waits for that.
        from kubernetes import client

        client.CoreV1Api(api.api_client()).patch_namespaced_pod_status(
            POD,
            NS,
            {
                "status": {
                    "phase": "Running",
                    "podIP": "127.0.0.1",
                    "conditions": [{"type": "Ready", "status": "True"}],
                }
            },
            _preload_content=False,
        )

        template = tmp_path / "executor-pod-template.yaml"
        template.write_text(config_map["data"]["executor-pod-template.yaml"])
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        master = f"k8s://{api.url}"
        submit_args = (
            env["PYSPARK_SUBMIT_ARGS"]
            .replace("k8s://https://kubernetes.default.svc", master)
            .replace("/etc/epochal/executor-pod-template.yaml", str(template))
            .replace("spark.driver.bindAddress=0.0.0.0", "spark.driver.bindAddress=127.0.0.1")
        )
        assert submit_args.count(master) == 1 and str(template) in submit_args
        probe_env = {
            **os.environ,
            **env,
            "SPARK_MASTER": master,
            "PYSPARK_SUBMIT_ARGS": submit_args,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYTHONPATH": str(PROJECT_ROOT),
        }
        log_path = tmp_path / "driver.log"
        with open(log_path, "wb") as log:
            probe = subprocess.Popen(
                [sys.executable, "-m", "tests.runners.spark_probe"],
                cwd=PROJECT_ROOT,
                env=probe_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + 120
            while len(executor_posts(api)) < 2:
                assert probe.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, log_path.read_text()[-3000:]
                time.sleep(0.2)
            requests = spark_requests(api)
        finally:
            os.killpg(probe.pid, signal.SIGKILL)
            probe.wait(timeout=30)
            end = time.monotonic() + 10
            while group_members(probe.pid) and time.monotonic() < end:
                time.sleep(0.05)
            assert not group_members(probe.pid), "the Spark driver JVM outlived the test"

    executor = executor_posts(api)[0].data
    meta, pod_spec = executor["metadata"], executor["spec"]
    assert meta["name"] == "orders-app-5b7c9d1e2f3a-exec-1"
    assert meta["ownerReferences"][0]["name"] == POD
    assert meta["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    for key, value in {
        "app.kubernetes.io/component": "spark-executor",
        "app.kubernetes.io/managed-by": "epochal",
        "epochal.io/run-id": "5b7c9d1e2f3a",
        "spark-role": "executor",
    }.items():
        assert meta["labels"][key] == value
    assert pod_spec["serviceAccountName"] == "epochal-spark"
    assert pod_spec["nodeSelector"] == {"pool": "spark"}
    assert {"key": "dedicated", "operator": "Equal", "value": "spark", "effect": "NoSchedule"} in (
        pod_spec["tolerations"]
    )
    assert pod_spec["imagePullSecrets"] == [{"name": "regcred"}]
    [container] = pod_spec["containers"]
    assert container["name"] == "spark-executor"
    assert container["image"] == IMAGE
    assert container["envFrom"] == [{"secretRef": {"name": "epochal-store"}}]
    assert container["resources"]["requests"] == {"cpu": "2", "memory": "1408Mi"}
    env_vars = {e["name"]: e.get("value") for e in container["env"]}
    assert env_vars["EPOCHAL_RUN_ID"] == "5b7c9d1e2f3a"
    assert env_vars["SPARK_DRIVER_URL"] == (
        f"spark://CoarseGrainedScheduler@orders-app-5b7c9d1e2f3a-driver-svc.{NS}.svc:7078"
    )
    # Everything Spark asked of the API server is granted to the job's ServiceAccount.
    allowed = {(rule.resource, verb) for rule in SPARK_DRIVER_RBAC_RULES for verb in rule.verbs}
    asked = {verb_of(r) for r in requests}
    assert {("pods", "create"), ("pods", "get"), ("pods", "watch")} <= asked
    assert asked <= allowed, asked - allowed
