"""A Spark standalone cluster on this machine: one master and N workers, each its own process.

For trying the standalone launcher, and for the tests and benchmarks that must show the engine
on executors that share nothing: every worker gets its own work directory, its own
`SPARK_LOCAL_DIRS` and its own state cache (`EPOCHAL_STATE_CACHE_DIR`), which its executors
inherit, so no state can pass from one executor to another through a local disk; the store
must be one every executor reaches on its own (an object store).

    python -m runners.local_cluster up --dir var/cluster --workers 2   # prints the master URL
    python -m runners.local_cluster down --dir var/cluster

The master and workers are the ones shipped inside the pyspark install
(`bin/spark-class org.apache.spark.deploy.master.Master` / `...deploy.worker.Worker`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runners import config
from runners.processes import read_json, write_json

#: How long the master and its workers may take to register (a JVM start each).
START_TIMEOUT_S = 90.0


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


@dataclass(frozen=True)
class Executor:
    """An executor JVM of an application on this cluster."""

    pid: int
    executor_id: str
    app_id: str
    worker: int  # index of the worker that started it


@dataclass
class LocalCluster:
    """A standalone master and `workers` workers under `root` (see the module docstring)."""

    root: Path
    workers: int = 2
    cores: int = 1
    worker_memory: str = "3g"
    master_port: int = 0
    webui_port: int = 0
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def worker_dir(self, index: int) -> Path:
        return self.root / f"worker-{index}"

    def state_cache(self, index: int) -> Path:
        """The state cache of worker `index`'s executors."""
        return self.worker_dir(index) / "state-cache"

    def _env(self, index: int | None) -> dict[str, str]:
        env = config.environment()
        env.update(SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1")
        env.pop("PYSPARK_SUBMIT_ARGS", None)
        if index is not None:
            home = self.worker_dir(index)
            env["SPARK_LOCAL_DIRS"] = str(home / "local")
            env["EPOCHAL_STATE_CACHE_DIR"] = str(self.state_cache(index))
            env["SPARK_WORKER_DIR"] = str(home / "work")
        return env

    def _spawn(self, name: str, args: Sequence[str], index: int | None) -> None:
        log = self.root / f"{name}.log"
        cmd = [str(spark_home() / "bin" / "spark-class"), *args]
        with log.open("ab") as out:
            proc = subprocess.Popen(
                cmd,
                env=self._env(index),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pids[name] = proc.pid
        self._save()

    def _save(self) -> None:
        write_json(
            self.root / "cluster.json",
            {
                "workers": self.workers,
                "cores": self.cores,
                "master_port": self.master_port,
                "webui_port": self.webui_port,
                "pids": self.pids,
            },
        )

    @classmethod
    def attach(cls, root: Path) -> LocalCluster | None:
        """The cluster `up` started under `root`, if its record is there."""
        data = read_json(Path(root) / "cluster.json")
        if data is None:
            return None
        return cls(
            root=Path(root),
            workers=int(data["workers"]),
            cores=int(data["cores"]),
            master_port=int(data["master_port"]),
            webui_port=int(data["webui_port"]),
            pids={str(k): int(v) for k, v in data["pids"].items()},
        )

    def state(self) -> dict[str, Any]:
        """The master's own view (its web UI's JSON): workers alive, applications."""
        url = f"http://127.0.0.1:{self.webui_port}/json/"
        with urllib.request.urlopen(url, timeout=2) as answer:
            state: dict[str, Any] = json.load(answer)
            return state

    def alive_workers(self) -> int:
        try:
            return int(self.state().get("aliveworkers", 0))
        except (OSError, ValueError):
            return 0

    def start(self) -> LocalCluster:
        """Start the master and every worker; return once all workers registered."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.master_port = self.master_port or free_port()
        self.webui_port = self.webui_port or free_port()
        args = ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
        args += ["--port", str(self.master_port), "--webui-port", str(self.webui_port)]
        self._spawn("master", args, None)
        for index in range(self.workers):
            self.start_worker(index, wait=False)
        self.wait_for_workers(self.workers)
        return self

    def start_worker(self, index: int, *, wait: bool = True) -> None:
        home = self.worker_dir(index)
        for sub in ("work", "local", "state-cache"):
            (home / sub).mkdir(parents=True, exist_ok=True)
        args = ["org.apache.spark.deploy.worker.Worker", self.master_url, "--host", "127.0.0.1"]
        args += ["--cores", str(self.cores), "--memory", self.worker_memory]
        args += ["--work-dir", str(home / "work"), "--webui-port", "0"]
        self._spawn(f"worker-{index}", args, index)
        if wait:
            self.wait_for_workers(self.alive_workers() + 1)

    def wait_for_workers(self, count: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.alive_workers() < count:
            if time.monotonic() > deadline:
                logs = sorted(self.root.glob("*.log"))
                tails = {p.name: p.read_text(errors="replace")[-800:] for p in logs}
                raise RuntimeError(f"{count} workers did not register in time: {tails}")
            time.sleep(0.3)

    def executors(self) -> list[Executor]:
        """The executor JVMs the workers of this cluster run now."""
        found = []
        homes = {str(self.worker_dir(i) / "work"): i for i in range(self.workers)}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            argv = _cmdline(int(entry.name))
            if "org.apache.spark.executor.CoarseGrainedExecutorBackend" not in argv:
                continue
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            worker = next((i for home, i in homes.items() if cwd.startswith(home)), None)
            if worker is None:
                continue
            found.append(
                Executor(
                    pid=int(entry.name),
                    executor_id=argv[argv.index("--executor-id") + 1],
                    app_id=argv[argv.index("--app-id") + 1],
                    worker=worker,
                )
            )
        return sorted(found, key=lambda e: (e.app_id, int(e.executor_id)))

    def kill_worker(self, index: int) -> list[int]:
        """SIGKILL worker `index` and the executors it started (a lost machine); their pids."""
        killed = [e.pid for e in self.executors() if e.worker == index]
        pid = self.pids.get(f"worker-{index}")
        if pid is not None:
            killed.append(pid)
        for victim in killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        return killed

    def wipe_state_caches(self) -> None:
        """Empty every worker's state cache (what a restart on new machines finds)."""
        for index in range(self.workers):
            cache = self.state_cache(index)
            shutil.rmtree(cache, ignore_errors=True)
            cache.mkdir(parents=True)

    def stop(self) -> None:
        """Kill the master, the workers and every executor; keep the logs."""
        for executor in self.executors():
            with contextlib.suppress(ProcessLookupError):
                os.kill(executor.pid, signal.SIGKILL)
        for pid in self.pids.values():  # each leads its own process group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        self.pids.clear()
        (self.root / "cluster.json").unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runners.local_cluster", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--dir", type=Path, default=Path("var/cluster"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores per worker")
    args = parser.parse_args(argv)
    cluster = LocalCluster.attach(args.dir)
    if args.command == "up":
        if cluster is not None and cluster.alive_workers():
            print(cluster.master_url)
            return 0
        cluster = LocalCluster(args.dir.resolve(), workers=args.workers, cores=args.cores).start()
        print(cluster.master_url)
        return 0
    if cluster is None:
        print(f"no cluster under {args.dir}", file=sys.stderr)
        return 1 if args.command == "status" else 0
    if args.command == "down":
        cluster.stop()
        return 0
    print(f"{cluster.master_url}: {cluster.alive_workers()} workers alive")
    return 0


if __name__ == "__main__":
    sys.exit(main())
