"""A kubelet double: runs the executor Pods Spark creates in the API double as local processes.

A real kubelet pulls the Pod's image, starts its entry point with the Pod's args and resolved
environment, reports the Pod `Running` with an IP, reports `Failed`/`Succeeded` when the
container exits, and stops the container (SIGTERM, SIGKILL after the grace period) when the
Pod is deleted. This one does the same on this machine, for Pods labelled
`spark-role=executor`:

- the "image" is this checkout: its entry point `docker/entrypoint.sh` runs with the Pod's
  args (`executor`), with `SPARK_HOME` the pip-installed pyspark and the working directory the
  repository root (the image's WORKDIR); `/usr/bin/tini` (not installed here) is replaced in
  the script by a shim that execs its command, the only change to the script;
- `valueFrom.fieldRef` variables resolve to what the kubelet knows (`status.podIP` is
  127.0.0.1, `metadata.name`, `metadata.namespace`); every `emptyDir` mount path in a
  variable (Spark's `SPARK_LOCAL_DIRS`) becomes a directory of its own under `workdir`;
- each process has its own process group, its output in `workdir/<pod>.log`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyspark

from runners.local import PROJECT_ROOT, group_members
from tests.runners.kube_double import RunningDouble

ENTRYPOINT = PROJECT_ROOT / "docker" / "entrypoint.sh"
TINI_SHIM = """#!/bin/sh
# stands in for tini: skip its options up to "--", then exec the command
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done
shift
exec "$@"
"""
POD_IP = "127.0.0.1"


@dataclass
class Container:
    name: str
    namespace: str
    process: subprocess.Popen[bytes]
    deleted: bool = False
    reported: bool = False


@dataclass
class Kubelet:
    workdir: Path
    #: PYTHONPATH of the "image": where the job's code is installed
    image_pythonpath: str = ""
    grace_s: float = 5.0
    double: RunningDouble | None = None
    containers: dict[str, Container] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        tini = self.workdir / "tini"
        tini.write_text(TINI_SHIM)
        tini.chmod(0o755)
        self.entrypoint = self.workdir / "entrypoint.sh"
        self.entrypoint.write_text(ENTRYPOINT.read_text().replace("/usr/bin/tini", str(tini)))
        self._monitor = threading.Thread(target=self._watch_exits, daemon=True)
        self._monitor.start()

    # -- the API double's hook (runs in its event loop: never block) ---------------------------

    def on_change(self, event: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata", {})
        name = meta.get("name", "")
        if event == "ADDED" and (meta.get("labels") or {}).get("spark-role") == "executor":
            self._start(pod)
        elif event == "DELETED" or (event == "MODIFIED" and meta.get("deletionTimestamp")):
            self._kill(name)

    def _environment(self, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        meta = pod["metadata"]
        fields = {
            "status.podIP": POD_IP,
            "metadata.name": meta["name"],
            "metadata.namespace": meta.get("namespace", ""),
        }
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", []) if "emptyDir" in v}
        mounts = {}
        for mount in container.get("volumeMounts", []):
            if mount["name"] in volumes:
                local = self.workdir / meta["name"] / mount["name"]
                local.mkdir(parents=True, exist_ok=True)
                mounts[mount["mountPath"]] = str(local)
        env = {
            key: os.environ[key]
            for key in ("PATH", "HOME", "LANG", "JAVA_HOME", "SPARK_LOCAL_IP")
            if key in os.environ
        }
        if self.image_pythonpath:
            env["PYTHONPATH"] = self.image_pythonpath
        env["SPARK_HOME"] = str(Path(pyspark.__file__).parent)
        for var in container.get("env", []):
            if "value" in var:
                value = str(var["value"])
            elif "fieldRef" in (var.get("valueFrom") or {}):
                value = fields.get(var["valueFrom"]["fieldRef"]["fieldPath"], "")
            else:
                continue  # Secrets and ConfigMaps: none in these tests
            for path, local in mounts.items():
                value = value.replace(path, local)
            env[var["name"]] = value
        return env

    def _start(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        [container] = pod["spec"]["containers"]
        log = open(self.workdir / f"{meta['name']}.log", "wb")  # noqa: SIM115 (child owns it)
        process = subprocess.Popen(
            ["bash", str(self.entrypoint), *container.get("args", [])],
            cwd=PROJECT_ROOT,
            env=self._environment(pod, container),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        with self._lock:
            self.containers[meta["name"]] = Container(
                meta["name"], meta.get("namespace", ""), process
            )
            self.started.append(meta["name"])
        self._report(
            meta.get("namespace", ""),
            meta["name"],
            {
                "phase": "Running",
                "podIP": POD_IP,
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [
                    {"name": container["name"], "ready": True, "state": {"running": {}}}
                ],
            },
        )

    def _kill(self, name: str) -> None:
        with self._lock:
            running = self.containers.get(name)
            if running is None or running.deleted:
                return
            running.deleted = True
        pid = running.process.pid

        def stop() -> None:
            _signal_group(pid, signal.SIGTERM)
            deadline = time.monotonic() + self.grace_s
            while group_members(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            _signal_group(pid, signal.SIGKILL)

        threading.Thread(target=stop, daemon=True).start()

    # -- container exits ---------------------------------------------------------------------

    def _watch_exits(self) -> None:
        while not self._stop.wait(0.3):
            with self._lock:
                exited = [
                    c
                    for c in self.containers.values()
                    if not c.reported and c.process.poll() is not None
                ]
                for c in exited:
                    c.reported = True
            for c in exited:
                if c.deleted:
                    continue  # the Pod is gone already
                code = c.process.returncode
                self._report(
                    c.namespace,
                    c.name,
                    {
                        "phase": "Succeeded" if code == 0 else "Failed",
                        "containerStatuses": [
                            {
                                "name": "spark-executor",
                                "ready": False,
                                "state": {"terminated": {"exitCode": code, "reason": "Error"}},
                            }
                        ],
                    },
                )

    def _report(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        assert self.double is not None, "attach the kubelet to the API double first"
        coro = self.double.k.set_pod_status(namespace, name, status)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.double.loop:
            running.create_task(coro)
        else:
            asyncio.run_coroutine_threadsafe(coro, self.double.loop).result(timeout=10)

    # -- for the tests -----------------------------------------------------------------------

    def alive(self) -> list[str]:
        """Pods whose executor process group still has members."""
        with self._lock:
            return sorted(n for n, c in self.containers.items() if group_members(c.process.pid))

    def log(self, name: str) -> str:
        """What Pod `name`'s process wrote so far."""
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def registered(self) -> list[str]:
        """Pods whose executor says it registered with the driver (its log)."""
        with self._lock:
            names = sorted(self.containers)
        return [n for n in names if "Successfully registered with driver" in self.log(n)]

    def stop(self) -> None:
        """Kill every process started (the test's cleanup); waits until they are gone."""
        self._stop.set()
        with self._lock:
            pids = [c.process.pid for c in self.containers.values()]
        for pid in pids:
            _signal_group(pid, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while any(group_members(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        for c in self.containers.values():
            c.process.wait(timeout=5)


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signum)
