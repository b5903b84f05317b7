"""KubernetesLauncher against an API server double over real HTTP, through the official client."""

from __future__ import annotations

import json
import shlex
import threading
import time
from collections.abc import Iterator
from typing import Any

import kmock
import pytest
import yaml
from kubernetes import client

from runners.job_spec import JobSpec, Resources, Toleration
from runners.kubernetes import (
    KubernetesApiError,
    KubernetesForbiddenError,
    KubernetesLauncher,
    manifests,
    pod_status,
)
from runners.launcher import STOP_KEY, LauncherError, RunHandle, RunPhase, RunStatus
from snapshots_store import Repository
from tests.runners.kube_double import RunningDouble, api_server_double

NS = "streaming"
IMAGE = "registry.example.com/epochal:1.4.0"


@pytest.fixture
def api() -> Iterator[RunningDouble]:
    with api_server_double() as double:
        yield double


@pytest.fixture
def launcher(api: RunningDouble) -> KubernetesLauncher:
    return KubernetesLauncher(
        namespace=NS,
        image=IMAGE,
        service_account="epochal-spark",
        api_client=api.api_client(),
        kill_grace_s=20,
        poll_interval_s=0.05,
        backoff_s=0.01,
    )


@pytest.fixture
def spec(make_spec) -> JobSpec:  # type: ignore[no-untyped-def]
    return make_spec(
        "until_stopped",
        parallelism=3,
        max_epochs=100,
        run_id="3f2a1b9c0d1e",
        resources=Resources(
            driver_cores=2, driver_memory_mb=2048, executor_cores=2, executor_memory_mb=4096
        ),
        node_selector={"pool": "spark"},
        tolerations=(Toleration(key="dedicated", value="spark", effect="NoSchedule"),),
        image_pull_secrets=("regcred",),
        store_credentials_secret="epochal-store",
        spark_conf={"spark.sql.shuffle.partitions": "12", "spark.driver.port": "1"},
    )


def core(api: RunningDouble) -> client.CoreV1Api:
    return client.CoreV1Api(api.api_client())


def set_pod_status(api: RunningDouble, name: str, status: dict[str, Any]) -> None:
    core(api).patch_namespaced_pod_status(name, NS, {"status": status}, _preload_content=False)


def submit_conf(args: str) -> tuple[str, dict[str, str]]:
    """(master, confs) from a PYSPARK_SUBMIT_ARGS string."""
    words = shlex.split(args)
    assert words[-1] == "pyspark-shell"
    confs = dict(words[i + 1].split("=", 1) for i, w in enumerate(words) if w == "--conf")
    return words[words.index("--master") + 1], confs


POD = "orders-app-3f2a1b9c0d1e-driver"
SVC = "orders-app-3f2a1b9c0d1e-driver-svc"
CM = "orders-app-3f2a1b9c0d1e-spec"
RUN_LABELS = {
    "app.kubernetes.io/name": "epochal-job",
    "app.kubernetes.io/managed-by": "epochal",
    "app.kubernetes.io/component": "spark-driver",
    "epochal.io/application": "orders-app",
    "epochal.io/run-id": "3f2a1b9c0d1e",
}


def test_start_creates_driver_pod_service_and_config_map(api, launcher, spec) -> None:  # type: ignore[no-untyped-def]
    handle = launcher.start(spec)
    assert handle == RunHandle.for_spec(spec, runner="kubernetes", location=NS)

    pod = api.object("pods", NS, POD)
    assert pod is not None
    assert pod["metadata"]["labels"] == RUN_LABELS
    assert pod["metadata"]["annotations"] == {
        "epochal.io/application": "Orders App",
        "epochal.io/namespace": "orders",
        "epochal.io/branch": "main",
    }
    pod_spec = pod["spec"]
    assert pod_spec["restartPolicy"] == "Never"
    assert pod_spec["serviceAccountName"] == "epochal-spark"
    assert pod_spec["terminationGracePeriodSeconds"] == 20
    assert pod_spec["nodeSelector"] == {"pool": "spark"}
    assert pod_spec["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "spark", "effect": "NoSchedule"}
    ]
    assert pod_spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod_spec["volumes"] == [{"name": "job-spec", "configMap": {"name": CM}}]
    [container] = pod_spec["containers"]
    assert container["name"] == "spark-driver"
    assert container["image"] == IMAGE
    assert "command" not in container  # the image entry point (tini) runs the args
    assert container["args"] == ["python", "-m", "runners.engine.main", *spec.engine_arguments()]
    assert container["envFrom"] == [{"secretRef": {"name": "epochal-store"}}]
    assert container["ports"] == [
        {"name": "driver-rpc", "containerPort": 7078, "protocol": "TCP"},
        {"name": "blockmanager", "containerPort": 7079, "protocol": "TCP"},
        {"name": "spark-ui", "containerPort": 4040, "protocol": "TCP"},
    ]
    assert container["resources"] == {
        "requests": {"cpu": "2", "memory": "2432Mi"},
        "limits": {"memory": "2432Mi"},
    }
    assert container["volumeMounts"] == [
        {"name": "job-spec", "mountPath": "/etc/epochal", "readOnly": True}
    ]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert set(env) == {
        "SPARK_MASTER",
        "PYSPARK_SUBMIT_ARGS",
        "EPOCHAL_RUN_ID",
        "STORE_URL",
        "PYTHONUNBUFFERED",
    }  # fmt: skip  -- credentials only through envFrom, never inline
    assert env["SPARK_MASTER"] == "k8s://https://kubernetes.default.svc"
    assert env["EPOCHAL_RUN_ID"] == "3f2a1b9c0d1e"
    assert env["STORE_URL"] == spec.store_url
    master, conf = submit_conf(env["PYSPARK_SUBMIT_ARGS"])
    assert master == "k8s://https://kubernetes.default.svc"
    assert "--driver-memory 2048m" in env["PYSPARK_SUBMIT_ARGS"]
    assert conf == {
        "spark.app.name": "Orders App",
        "spark.submit.deployMode": "client",
        "spark.kubernetes.namespace": NS,
        "spark.kubernetes.container.image": IMAGE,
        "spark.kubernetes.container.image.pullPolicy": "IfNotPresent",
        "spark.kubernetes.container.image.pullSecrets": "regcred",
        "spark.kubernetes.driver.pod.name": POD,
        "spark.kubernetes.executor.podNamePrefix": "orders-app-3f2a1b9c0d1e",
        "spark.kubernetes.authenticate.executor.serviceAccountName": "epochal-spark",
        "spark.kubernetes.executor.podTemplateFile": "/etc/epochal/executor-pod-template.yaml",
        "spark.kubernetes.executor.podTemplateContainerName": "spark-executor",
        "spark.kubernetes.executor.deleteOnTermination": "true",
        "spark.driver.host": f"{SVC}.{NS}.svc",
        "spark.driver.bindAddress": "0.0.0.0",
        "spark.kubernetes.executor.useDriverPodIP": "false",
        "spark.driver.port": "7078",  # ours wins over the spec's "1"
        "spark.driver.blockManager.port": "7079",
        "spark.ui.port": "4040",  # the Service's spark-ui port: the control plane proxies it
        "spark.executor.instances": "2",  # ceil(parallelism 3 / 2 cores)
        "spark.executor.cores": "2",
        "spark.executor.memory": "4096m",
        "spark.default.parallelism": "3",
        "spark.executorEnv.EPOCHAL_RUN_ID": "3f2a1b9c0d1e",
        "spark.sql.shuffle.partitions": "12",
        **{
            f"spark.kubernetes.executor.label.{k}": v
            for k, v in {**RUN_LABELS, "app.kubernetes.io/component": "spark-executor"}.items()
        },
        "spark.kubernetes.executor.node.selector.pool": "spark",
    }

    owner = [
        {"apiVersion": "v1", "kind": "Pod", "name": POD, "uid": pod["metadata"]["uid"],
         "controller": True}
    ]  # fmt: skip
    service = api.object("services", NS, SVC)
    assert service is not None
    assert service["metadata"]["labels"] == RUN_LABELS
    assert service["metadata"]["ownerReferences"] == owner
    assert service["spec"] == {
        "clusterIP": "None",
        "selector": {
            "epochal.io/run-id": "3f2a1b9c0d1e",
            "app.kubernetes.io/component": "spark-driver",
        },
        "ports": [
            {"name": "driver-rpc", "port": 7078, "targetPort": 7078},
            {"name": "blockmanager", "port": 7079, "targetPort": 7079},
            {"name": "spark-ui", "port": 4040, "targetPort": 4040},
        ],
    }
    config_map = api.object("configmaps", NS, CM)
    assert config_map is not None
    assert config_map["metadata"]["ownerReferences"] == owner
    assert config_map["metadata"]["labels"] == RUN_LABELS
    stored = JobSpec.from_dict(json.loads(config_map["data"]["job-spec.json"]))
    assert stored.run_id == spec.run_id and stored.image == IMAGE
    assert stored.service_account == "epochal-spark"
    assert yaml.safe_load(config_map["data"]["executor-pod-template.yaml"]) == {
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": {
            "containers": [
                {"name": "spark-executor", "envFrom": [{"secretRef": {"name": "epochal-store"}}]}
            ],
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "spark", "effect": "NoSchedule"}
            ],
        },
    }


def test_launcher_defaults_fill_what_the_spec_leaves_open(api, make_spec) -> None:  # type: ignore[no-untyped-def]
    launcher = KubernetesLauncher(
        namespace=NS,
        image=IMAGE,
        api_client=api.api_client(),
        store_credentials_secret="chart-store-secret",
        image_pull_secrets=("chart-pull",),
    )
    spec = make_spec(run_id="aaaa00000001")
    launcher.start(spec)
    pod = api.object("pods", NS, "orders-app-aaaa00000001-driver")
    assert pod is not None
    [container] = pod["spec"]["containers"]
    assert container["envFrom"] == [{"secretRef": {"name": "chart-store-secret"}}]
    assert pod["spec"]["imagePullSecrets"] == [{"name": "chart-pull"}]
    assert "nodeSelector" not in pod["spec"] and "tolerations" not in pod["spec"]
    assert container["resources"]["requests"] == {"cpu": "1", "memory": "1408Mi"}


def test_status_follows_the_driver_pod(api, launcher, spec) -> None:  # type: ignore[no-untyped-def]
    handle = launcher.start(spec)
    assert launcher.status(handle) == RunStatus(
        phase=RunPhase.PENDING, reason="waiting to be scheduled"
    )
    set_pod_status(
        api,
        POD,
        {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": "spark-driver",
                    "state": {
                        "waiting": {
                            "reason": "ImagePullBackOff",
                            "message": f'Back-off pulling image "{IMAGE}"',
                        }
                    },
                }
            ],
        },
    )
    assert launcher.status(handle) == RunStatus(
        phase=RunPhase.PENDING, reason=f'ImagePullBackOff: Back-off pulling image "{IMAGE}"'
    )
    set_pod_status(
        api,
        POD,
        {
            "phase": "Running",
            "containerStatuses": [{"name": "spark-driver", "state": {"running": {}}}],
        },
    )
    assert launcher.status(handle) == RunStatus(phase=RunPhase.RUNNING)
    set_pod_status(
        api,
        POD,
        {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "spark-driver",
                    "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
                }
            ],
        },
    )
    assert launcher.status(handle) == RunStatus(
        phase=RunPhase.FAILED, reason="OOMKilled (exit code 137)", exit_code=137
    )
    set_pod_status(api, POD, {"phase": "Succeeded"})
    assert launcher.status(handle) == RunStatus(phase=RunPhase.SUCCEEDED, exit_code=0)


def test_pod_status_reasons_a_user_can_act_on() -> None:
    failed = {
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "spark-driver",
                    "state": {
                        "terminated": {"reason": "Error", "exitCode": 1, "message": "boom\n"}
                    },
                }
            ],
        }
    }
    assert pod_status(failed) == RunStatus(
        phase=RunPhase.FAILED, reason="Error (exit code 1): boom", exit_code=1
    )
    evicted = {"status": {"phase": "Failed", "reason": "Evicted", "message": "low on memory"}}
    assert pod_status(evicted).reason == "Evicted: low on memory"
    unschedulable = {
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient memory.",
                }
            ],
        }
    }
    assert pod_status(unschedulable).reason == (
        "Unschedulable: 0/3 nodes are available: 3 Insufficient memory."
    )
    config_error = {
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": "spark-driver",
                    "state": {
                        "waiting": {
                            "reason": "CreateContainerConfigError",
                            "message": 'secret "epochal-store" not found',
                        }
                    },
                }
            ],
        }
    }
    assert pod_status(config_error).reason == (
        'CreateContainerConfigError: secret "epochal-store" not found'
    )


def test_stop_asks_the_job_to_stop_at_an_epoch_boundary(api, launcher, spec, store_url) -> None:  # type: ignore[no-untyped-def]
    handle = launcher.start(spec)
    set_pod_status(api, POD, {"phase": "Running"})
    repo = Repository.open(store_url, "orders")
    result: dict[str, RunStatus] = {}
    stopper = threading.Thread(target=lambda: result.update(s=launcher.stop(handle, 30)))
    stopper.start()
    deadline = time.monotonic() + 10
    while repo.read_control("main")[0].get(STOP_KEY, {}).get("run_id") != spec.run_id:
        assert time.monotonic() < deadline, "the stop request never reached the control document"
        time.sleep(0.02)
    set_pod_status(api, POD, {"phase": "Succeeded"})  # the job stopped at the boundary
    stopper.join(timeout=10)
    assert result["s"] == RunStatus(phase=RunPhase.SUCCEEDED, exit_code=0)
    assert api.object("pods", NS, POD) is not None  # kept for its logs until cleanup
    assert api.requests("DELETE", f"/api/v1/namespaces/{NS}/pods/{POD}") == []


def test_stop_deletes_the_driver_at_the_deadline(api, launcher, spec) -> None:  # type: ignore[no-untyped-def]
    handle = launcher.start(spec)
    set_pod_status(api, POD, {"phase": "Running"})
    status = launcher.stop(handle, deadline_s=0.3)
    assert status.phase is RunPhase.FAILED
    assert "deleted at the 0.3 s stop deadline" in status.reason
    [delete] = api.requests("DELETE", f"/api/v1/namespaces/{NS}/pods/{POD}")
    assert delete.params["gracePeriodSeconds"] == "20"  # kubelet: SIGTERM, SIGKILL 20 s later
    assert api.object("pods", NS, POD) is None
    assert "not found" in launcher.status(handle).reason


def test_cleanup_removes_every_object_of_the_run_and_is_idempotent(api, launcher, spec) -> None:  # type: ignore[no-untyped-def]
    handle = launcher.start(spec)
    launcher.cleanup(handle)
    launcher.cleanup(handle)
    assert api.object("pods", NS, POD) is None
    assert api.object("services", NS, SVC) is None
    assert api.object("configmaps", NS, CM) is None


def test_starting_the_same_run_again_finds_its_objects(api, launcher, spec) -> None:  # type: ignore[no-untyped-def]
    first = launcher.start(spec)
    uid = api.object("pods", NS, POD)["metadata"]["uid"]  # type: ignore[index]
    assert launcher.start(spec) == first
    assert api.object("pods", NS, POD)["metadata"]["uid"] == uid  # type: ignore[index]
    assert len(api.requests("POST", f"/api/v1/namespaces/{NS}/pods")) == 2  # second got 409


def test_a_start_interrupted_after_the_pod_completes_on_retry(api, launcher, spec) -> None:  # type: ignore[no-untyped-def]
    launcher.start(spec)
    core(api).delete_namespaced_service(SVC, NS)  # as if the first start died before it
    core(api).delete_namespaced_config_map(CM, NS)
    launcher.start(spec)
    uid = api.object("pods", NS, POD)["metadata"]["uid"]  # type: ignore[index]
    for plural, name in (("services", SVC), ("configmaps", CM)):
        recreated = api.object(plural, NS, name)
        assert recreated is not None
        assert recreated["metadata"]["ownerReferences"][0]["uid"] == uid


def test_a_foreign_object_with_the_run_name_is_refused(api, launcher, spec) -> None:  # type: ignore[no-untyped-def]
    core(api).create_namespaced_pod(
        NS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": POD, "labels": {"epochal.io/run-id": "someone-else"}},
            "spec": {"containers": [{"name": "x", "image": "busybox"}]},
        },
    )
    with pytest.raises(KubernetesApiError, match="belongs to run 'someone-else'"):
        launcher.start(spec)


def test_forbidden_names_the_verb_and_resource(api, launcher, spec) -> None:  # type: ignore[no-untyped-def]
    (
        api.k["post", kmock.path(f"/api/v1/namespaces/{NS}/services")]
        << 403
        << {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "reason": "Forbidden",
            "code": 403,
            "message": 'services is forbidden: User "system:serviceaccount:epochal:epochal" '
            'cannot create resource "services" in API group "" in the namespace "streaming"',
        }
    )
    with pytest.raises(KubernetesForbiddenError) as err:
        launcher.start(spec)
    assert (err.value.verb, err.value.resource, err.value.namespace) == ("create", "services", NS)
    assert "refused to create services in namespace streaming (403 Forbidden)" in str(err.value)
    assert len(api.requests("POST", f"/api/v1/namespaces/{NS}/services")) == 1  # no retry


def test_server_errors_are_retried_with_back_off(api, launcher, spec) -> None:  # type: ignore[no-untyped-def]
    api.k["post", kmock.path(f"/api/v1/namespaces/{NS}/pods")][:2] << 503
    api.k["get", kmock.path(f"/api/v1/namespaces/{NS}/pods/{POD}")][:2] << 500
    handle = launcher.start(spec)  # 503, then 409 (the server had stored it): found, ours
    assert len(api.requests("POST", f"/api/v1/namespaces/{NS}/pods")) == 2
    assert launcher.status(handle).phase is RunPhase.PENDING
    assert api.object("services", NS, SVC) is not None


def test_an_unreachable_api_server_is_a_clear_error(spec) -> None:  # type: ignore[no-untyped-def]
    cfg = client.Configuration()
    cfg.host = "http://127.0.0.1:9"  # discard port: connection refused
    cfg.retries = 0
    launcher = KubernetesLauncher(
        namespace=NS, image=IMAGE, api_client=client.ApiClient(cfg), retries=2, backoff_s=0.01
    )
    with pytest.raises(
        KubernetesApiError, match="cannot reach the Kubernetes API to create pods after 3 attempts"
    ):
        launcher.start(spec)


def test_logs_tail_the_driver_container(api, launcher, spec) -> None:  # type: ignore[no-untyped-def]
    handle = launcher.start(spec)
    api.k["get", kmock.path(f"/api/v1/namespaces/{NS}/pods/{POD}/log")] << b"epoch 41\nepoch 42\n"
    assert launcher.logs(handle, tail_lines=2) == "epoch 41\nepoch 42\n"
    [request] = api.requests("GET", f"/api/v1/namespaces/{NS}/pods/{POD}/log")
    assert request.params == {"container": "spark-driver", "tailLines": "2"}


def test_a_missing_image_is_refused_before_any_call(api, make_spec) -> None:  # type: ignore[no-untyped-def]
    launcher = KubernetesLauncher(namespace=NS, image=None, api_client=api.api_client())
    with pytest.raises(Exception, match="EPOCHAL_IMAGE"):
        launcher.start(make_spec())
    assert list(api.k[:]) == []


def test_credentials_named_by_variables_without_a_secret_are_refused_before_any_call(  # type: ignore[no-untyped-def]
    api, launcher, make_spec
) -> None:
    spec = make_spec(store_credentials_env="ARCHIVE")
    with pytest.raises(LauncherError, match=r"\$ARCHIVE_AWS_\*.*credentials_secret"):
        launcher.start(spec)
    rows = [{"name": "rows", "kind": "postgres", "config": {"password_env": "ROWS_PW"}}]
    spec = make_spec(sinks=rows, sink_credentials_env={"rows": "ROWS_PW"})
    with pytest.raises(LauncherError, match=r"sink 'rows' .*\$ROWS_PW.*credentials_secret"):
        launcher.start(spec)
    assert list(api.k[:]) == []  # nothing was created, no secret written into a pod spec


def test_sink_secrets_are_mounted_beside_the_stores_on_driver_and_executors(  # type: ignore[no-untyped-def]
    api, launcher, make_spec
) -> None:
    sinks = [
        {"name": "rows", "kind": "postgres", "config": {"password_env": "ROWS_PW"}},
        {"name": "lake", "kind": "delta", "config": {"credentials_env": "LAKE"}},
        {"name": "copy", "kind": "postgres", "config": {"password_env": "ROWS_PW"}},
    ]
    spec = make_spec(
        run_id="aaaa00000002",
        store_credentials_secret="store-creds",
        sinks=sinks,
        sink_credentials_env={"rows": "ROWS_PW", "lake": "LAKE", "copy": "ROWS_PW"},
        sink_secrets={"rows": "rows-db", "lake": "lake-s3", "copy": "rows-db"},
    )
    launcher.start(spec)
    pod = api.object("pods", NS, "orders-app-aaaa00000002-driver")
    assert pod is not None
    [container] = pod["spec"]["containers"]
    mounted = [{"secretRef": {"name": n}} for n in ("store-creds", "rows-db", "lake-s3")]
    assert container["envFrom"] == mounted  # each Secret once, the store's first
    assert "ROWS_PW" not in json.dumps(container["env"])  # the variable comes from the Secret
    [executor] = manifests.executor_pod_template(spec)["spec"]["containers"]
    assert executor["envFrom"] == mounted
