"""`manage.py demo` as a user runs it, in a subprocess on the embedded default (SQLite, the
filesystem broker, a local store), all under one directory: start it, read what it prints,
signal it, and find every process it left behind.

The demo runs in its own session (like a terminal's foreground job), so the test can tell its
processes from everything else: the demo itself, its Celery worker and the Spark job runs,
each in their own process group, all found by walking /proc from the demo's pid and from the
runs' pid files.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APPLICATION = "clickstream"
JOB = "clickstream-main"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def demo_env(var_dir: Path) -> dict[str, str]:
    """The environment of a user's shell running the demo under `var_dir`: the embedded
    default (no broker, database or store configured), nothing of the test's services."""
    drop = ("EPOCHAL_", "DATABASE_URL", "CELERY_", "REDIS_URL", "STORE_URL", "RUNNER", "DJANGO_")
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(drop)},
        "EPOCHAL_VAR_DIR": str(var_dir),
        "DATABASE_URL": f"sqlite:///{var_dir / 'epochal.sqlite3'}",
        "STORE_URL": f"file://{var_dir / 'store'}",
        "SPARK_LOCAL_IP": "127.0.0.1",
        # as bin/demo sets them: no DEBUG (no debug pages), a key of the demo's own
        "DJANGO_DEBUG": "false",
        "DJANGO_SECRET_KEY": "epochal-demo-test-" + "k" * 40,
        "PYTHONUNBUFFERED": "1",
    }


def children(pid: int) -> list[int]:
    """Every live descendant of `pid` (walking /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            parents[int(entry.name)] = int(fields[1])
    found: list[int] = []
    frontier = [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, parent in parents.items() if parent == p]
        found += kids
        frontier += kids
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class Demo:
    """One `manage.py demo` process (serving unless `--no-serve` is among its arguments)."""

    def __init__(
        self,
        var_dir: Path,
        *args: str,
        port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.var_dir = var_dir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**demo_env(var_dir), **(env or {})}
        self.lines: list[str] = []
        var_dir.mkdir(parents=True, exist_ok=True)
        migrate = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert migrate.returncode == 0, migrate.stdout + migrate.stderr
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "demo", "--port", str(self.port), *args],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.tree: set[int] = {self.proc.pid}  # every process seen in the demo's tree
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self.tree.update(children(self.proc.pid))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, text: str, *, timeout: float = 600, start: int = 0) -> int:
        """Wait until a line from index `start` on contains `text`; its index."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i in range(start, len(self.lines)):
                if text in self.lines[i]:
                    return i
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            self.tree.update(children(self.proc.pid))
            time.sleep(0.3)
        raise AssertionError(f"the demo did not print {text!r}; it printed:\n{self.output}")

    def wait_serving(self, *, timeout: float = 600) -> None:
        """Wait until the demo printed its banner and its server answers HTTP."""
        import urllib.error
        import urllib.request

        self.wait_for_line("Dashboard:", timeout=timeout)
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/login/", timeout=5) as response:
                    if response.status == 200:
                        return
            except (OSError, urllib.error.URLError) as exc:
                if time.monotonic() > deadline:
                    message = f"{self.url} does not answer ({exc}):\n{self.output}"
                    raise AssertionError(message) from None
            time.sleep(0.5)

    def run_pids(self) -> list[int]:
        """The process-group leaders of every job run the demo's control plane launched."""
        pids = []
        for pid_file in (self.var_dir / "runs").glob("*/pid"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                pids.append(int(json.loads(pid_file.read_text())["pid"]))
        return pids

    def processes(self) -> list[int]:
        """Live processes of the demo's tree: the demo, its descendants, the job runs and
        theirs, and any process seen in the tree before."""
        roots = [self.proc.pid, *self.run_pids()]
        found = set(self.tree)
        for root in roots:
            found.add(root)
            found.update(children(root))
        return sorted(p for p in found if alive(p))

    def signal(self, signum: int) -> int:
        """Send `signum` to the demo process (as `kill` does); its exit status."""
        self.tree.update(children(self.proc.pid))
        self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the demo still runs 300 s after {signal.Signals(signum).name}:\n{self.output}"
            ) from None
        finally:
            self._reader.join(timeout=10)

    def kill_everything(self) -> None:
        """Clean up whatever is still alive (a test's teardown; never part of an assertion)."""
        for pid in self.processes():
            with contextlib.suppress(OSError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def epochal(var_dir: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Run `.venv/bin/epochal ARGS` against the demo's data as a user's second shell does;
    its standard output (the command must succeed)."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "epochal"), *args],
        cwd=ROOT,
        env={**demo_env(var_dir), **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"epochal {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


def jobs(var_dir: Path, env: dict[str, str] | None = None) -> dict[str, dict[str, object]]:
    """`epochal jobs --json` by job name."""
    return {row["name"]: row for row in json.loads(epochal(var_dir, "jobs", "--json", env=env))}
