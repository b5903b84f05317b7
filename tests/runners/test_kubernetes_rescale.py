"""A live rescale on Kubernetes adds executor Pods (2 -> 4) and removes them at the epoch
boundary (4 -> 2), with real executors.

Everything the launcher and Spark do goes over real HTTP to the API double: the launcher
creates the driver Pod, ConfigMap and Service with the official client; the engine
(`python -m runners.engine.main` with the driver Pod's arguments and environment; only the
master URL, the template path and the driver's address and ports change, as in
test_spark_config.py) runs Spark's Kubernetes scheduler in client mode, which creates, watches
and deletes executor Pods with its fabric8 client. The kubelet double (kubelet.py) runs each
executor Pod as the image's entry point would (`docker/entrypoint.sh executor`: Spark's
KubernetesExecutorBackend), so the executors register with the driver and run the epochs'
tasks; deleting a Pod kills its process group.

The parallelism changes the way a live rescale does it: the control document's
`parallelism`, applied by the engine at the next epoch boundary.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from runners.engine.sources import Generator, write_parquet_file
from runners.job_spec import ENGINE_MODULE, JobSpec, Resources
from runners.kubernetes import SPARK_DRIVER_RBAC_RULES, KubernetesLauncher
from runners.local import PROJECT_ROOT, group_members
from snapshots_store import Manifest, Repository
from tests.conftest import SUBPROCESS_PYTHONPATH, require_service
from tests.demo_process import free_port
from tests.runners.kube_double import RunningDouble, api_server_double
from tests.runners.kubelet import Kubelet
from tests.runners.test_spark_config import spark_requests, verb_of

NS = "streaming"
IMAGE = "registry.example.com/epochal:1.4.0"
RUN_ID = "7c1d2e3f4a5b"
RECORDS = 1000
EXECUTORS = "spark-role=executor"


def wait_for(what: str, check: Callable[[], Any], timeout_s: float, log: Path) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; driver log:\n" + _tail(log))
        time.sleep(0.2)


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-4000:] if log.exists() else "(no log)"


def running_executors(api: RunningDouble) -> list[str]:
    return sorted(
        p["metadata"]["name"]
        for p in api.pods(NS, EXECUTORS)
        if (p.get("status") or {}).get("phase") == "Running"
    )


def executor_deletes(api: RunningDouble) -> list[Any]:
    """DELETE requests for executor Pods: by name, or a collection by label selector."""
    pods = f"/api/v1/namespaces/{NS}/pods"
    return [
        r
        for r in list(api.k[:])
        if r.method.value == "DELETE"
        and (r.url.path == pods or r.url.path.startswith(f"{pods}/orders-app-{RUN_ID}-exec-"))
    ]


def driver_command(api: RunningDouble, spec: JobSpec, tmp_path: Path) -> tuple[list[str], dict]:
    """The driver Pod's container as a local process: its args and environment with the
    master, template path, driver address and ports of this machine."""
    pod = api.object("pods", NS, f"orders-app-{RUN_ID}-driver")
    config_map = api.object("configmaps", NS, f"orders-app-{RUN_ID}-spec")
    assert pod is not None and config_map is not None
    template = tmp_path / "executor-pod-template.yaml"
    template.write_text(config_map["data"]["executor-pod-template.yaml"])
    [container] = pod["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    master = f"k8s://{api.url}"
    submit_args = (
        env["PYSPARK_SUBMIT_ARGS"]
        .replace("k8s://https://kubernetes.default.svc", master)
        .replace("/etc/epochal/executor-pod-template.yaml", str(template))
        .replace("spark.driver.bindAddress=0.0.0.0", "spark.driver.bindAddress=127.0.0.1")
        .replace(
            f"spark.driver.host=orders-app-{RUN_ID}-driver-svc.{NS}.svc",
            "spark.driver.host=127.0.0.1",
        )
        .replace("spark.driver.port=7078", f"spark.driver.port={free_port()}")
        .replace(
            "spark.driver.blockManager.port=7079", f"spark.driver.blockManager.port={free_port()}"
        )
    )
    assert "kubernetes.default.svc" not in submit_args and "7078" not in submit_args
    args = container["args"]
    assert args[:3] == ["python", "-m", ENGINE_MODULE]
    return [sys.executable, *args[1:]], {
        **os.environ,
        **env,
        "SPARK_MASTER": master,
        "PYSPARK_SUBMIT_ARGS": submit_args,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONPATH": SUBPROCESS_PYTHONPATH,
    }


@pytest.mark.spark
def test_live_rescale_adds_executor_pods_and_removes_them_at_the_epoch_boundary(
    tmp_path: Path,
) -> None:
    require_service("Java", shutil.which("java") is not None, "install OpenJDK 17")
    data = tmp_path / "data"
    data.mkdir()
    store_url = f"file://{tmp_path / 'store'}"
    spec = JobSpec(
        application="Orders App",
        namespace="orders",
        branch="main",
        store_url=store_url,
        job="aggregate-job",
        job_args={"directory": str(data)},
        parallelism=2,
        run_id=RUN_ID,
        follow=True,
        resources=Resources(executor_cores=1, executor_memory_mb=512, driver_memory_mb=768),
    )
    repo = Repository.open(store_url, "orders")
    generator = Generator(keys=50, records_per_epoch=RECORDS, seed=5)
    files = 0

    def add_file() -> None:
        nonlocal files
        write_parquet_file(str(data), f"part-{files:05d}", generator.block(files))
        files += 1

    def head() -> Manifest | None:
        ref = repo.read_ref("heads/main")
        return None if ref is None else repo.read_manifest(ref.target)

    def committed(epoch: int) -> Callable[[], Manifest | None]:
        def check() -> Manifest | None:
            assert driver.poll() is None, "the driver exited:\n" + _tail(log)
            m = head()
            return m if m is not None and m.epoch >= epoch else None

        return check

    def set_parallelism(p: int) -> None:
        _, version = repo.read_control("main")
        repo.write_control("main", {"parallelism": p, "operation_id": f"rescale-{p}"}, version)

    kubelet = Kubelet(tmp_path / "kubelet", image_pythonpath=SUBPROCESS_PYTHONPATH)
    log = tmp_path / "driver.log"
    with api_server_double(on_change=kubelet.on_change) as api:
        kubelet.double = api
        driver: subprocess.Popen[bytes] | None = None
        try:
            KubernetesLauncher(namespace=NS, image=IMAGE, api_client=api.api_client()).start(spec)
            client.CoreV1Api(api.api_client()).patch_namespaced_pod_status(
                f"orders-app-{RUN_ID}-driver",
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
            command, env = driver_command(api, spec, tmp_path)
            add_file()
            with open(log, "wb") as out:
                driver = subprocess.Popen(
                    command,
                    cwd=PROJECT_ROOT,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )

            # p = 2: Spark starts with two one-core executors
            first = wait_for("epoch 1", committed(1), 300, log)
            assert first.parallelism == 2 and first.extra["executors"]["requested"] == 2
            pair = wait_for("2 executors", lambda: len(running_executors(api)) == 2, 120, log)
            assert pair
            two = running_executors(api)

            # 2 -> 4: two more executor Pods, started and registered with the driver
            set_parallelism(4)
            add_file()
            second = wait_for("epoch 2", committed(2), 300, log)
            assert (second.kind, second.parallelism) == ("rescale", 4)
            assert second.extra["executors"]["requested"] == 4
            four = wait_for(
                "4 running executors registered with the driver",
                lambda: (
                    len(running_executors(api)) == 4
                    and len(kubelet.alive()) == 4
                    and set(kubelet.registered()) >= set(running_executors(api))
                ),
                180,
                log,
            )
            assert four
            added = sorted(set(running_executors(api)) - set(two))
            assert len(added) == 2 and all(f"orders-app-{RUN_ID}-exec-" in n for n in added)
            add_file()
            wait_for(
                "an epoch with 4 registered executors",
                lambda: (
                    committed(files)() is not None and head().extra["executors"]["registered"] == 4
                ),  # type: ignore[union-attr]
                180,
                log,
            )
            assert not executor_deletes(api), "no executor is removed while p = 4"
            ran = [n for n in added if "Got assigned task" in kubelet.log(n)]
            assert ran, "the added executors ran none of the epoch's tasks"

            # 4 -> 2: at the next boundary two executors are killed and their Pods deleted
            set_parallelism(2)
            add_file()
            shrunk = wait_for(f"epoch {files}", committed(files), 300, log)
            assert shrunk.parallelism == 2
            assert shrunk.extra["executors"] == {"requested": 2, "registered": 4, "removing": 2}
            wait_for(
                "2 executors left",
                lambda: len(api.pods(NS, EXECUTORS)) == 2 and len(kubelet.alive()) == 2,
                120,
                log,
            )
            assert executor_deletes(api)
            assert sorted(p["metadata"]["name"] for p in api.pods(NS, EXECUTORS)) == sorted(
                kubelet.alive()
            )
            add_file()
            last = wait_for(f"epoch {files}", committed(files), 300, log)
            assert last.extra["executors"]["registered"] == 2

            # every file read exactly once, in order: nothing lost or repeated by the rescales
            history, m = [], head()
            while m is not None:
                history.append((m.epoch, m.stats["records_in"]))
                m = repo.read_manifest(m.parents[0]) if m.parents else None
            assert sorted(history) == [(e, RECORDS) for e in range(1, files + 1)]
            # everything Spark asked of the API server is granted to the job's ServiceAccount
            allowed = {(r.resource, v) for r in SPARK_DRIVER_RBAC_RULES for v in r.verbs}
            asked = {verb_of(r) for r in spark_requests(api)}
            assert {("pods", "create"), ("pods", "watch"), ("pods", "list")} <= asked, asked
            assert ("pods", "delete") in asked, asked  # the removed executors, by name
            assert asked <= allowed, asked - allowed
        finally:
            if driver is not None:
                os.killpg(driver.pid, signal.SIGKILL)
                driver.wait(timeout=30)
                end = time.monotonic() + 10
                while group_members(driver.pid) and time.monotonic() < end:
                    time.sleep(0.05)
            kubelet.stop()
        assert driver is None or not group_members(driver.pid), "the driver outlived the test"
        assert not kubelet.alive(), "an executor outlived the test"
