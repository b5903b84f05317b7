"""Private PostgreSQL and Redis servers a test may stop, restart and cut: each on a free port,
its files in a temporary directory, never the machine's shared services. RabbitMQ is not
started privately (a node takes seconds to boot): a test gets a vhost of its own on the shared
node, behind a proxy it cuts instead.

As root, PostgreSQL runs as the `postgres` user (it refuses to run as root), the way
`bin/services` runs the shared one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

from tests.conftest import require_service
from tests.faults.tcp_proxy import TcpProxy


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


def _pg_bindir() -> Path | None:
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if versions:
        return versions[-1].parent
    found = shutil.which("pg_ctl")
    return Path(found).parent if found else None


class PrivatePostgres:
    """``initdb`` in a temp directory, then `start` / `stop` / `restart` at will."""

    def __init__(self, root: Path) -> None:
        bindir = _pg_bindir()
        require_service("PostgreSQL binaries", bindir is not None, "install postgresql")
        assert bindir is not None
        self.bindir = bindir
        self.user = "postgres" if os.geteuid() == 0 else None
        self.root = root
        self.data = root / "data"
        self.log = root / "server.log"
        self.port = free_port()
        root.mkdir(parents=True, exist_ok=True)
        if self.user:
            shutil.chown(root, self.user, self.user)
        self._run("initdb", "-D", str(self.data), "-U", "root", "--auth=trust",
                  "--encoding=UTF8", "--no-instructions")  # fmt: skip

    def _run(self, tool: str, *args: str) -> None:
        cmd = [str(self.bindir / tool), *args]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    @property
    def url(self) -> str:
        return f"postgres://root@127.0.0.1:{self.port}/postgres"

    def database_url(self, name: str) -> str:
        return f"postgres://root@127.0.0.1:{self.port}/{name}"

    def start(self) -> None:
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories='' "
            "-c fsync=off -c max_connections=50"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w",
                  "start")  # fmt: skip

    def stop(self, mode: str = "immediate") -> None:
        """``immediate``: as a crash (no shutdown checkpoint, clients cut at once)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        self.stop()
        self.start()

    def create_database(self, name: str) -> None:
        subprocess.run(
            ["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "root", "-d", "postgres",
             "-c", f'CREATE DATABASE "{name}"'],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip

    def terminate_backends(self, database: str) -> None:
        """`pg_terminate_backend` on every session of `database` but this one."""
        subprocess.run(
            ["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "root", "-d", "postgres",
             "-c", "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
             f"WHERE datname = '{database}' AND pid <> pg_backend_pid()"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip


@contextlib.contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    with tempfile.TemporaryDirectory(prefix="epochal-pg-") as tmp:
        os.chmod(tmp, 0o755)  # the postgres user reaches its data directory inside
        server = PrivatePostgres(Path(tmp) / "pg")
        server.start()
        try:
            yield server
        finally:
            with contextlib.suppress(subprocess.SubprocessError):
                server.stop()


class PrivateRedis:
    """A ``redis-server`` on a free port, no persistence unless `appendonly`."""

    def __init__(self, root: Path, *, appendonly: bool = True) -> None:
        require_service("redis-server", shutil.which("redis-server") is not None,
                        "install redis-server")  # fmt: skip
        self.root = root
        self.port = free_port()
        self.appendonly = appendonly
        self.proc: subprocess.Popen[bytes] | None = None
        root.mkdir(parents=True, exist_ok=True)

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.root), "--appendonly", "yes" if self.appendonly else "no",
             "--save", ""],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while not _answers(self.port):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGKILL (a crash): what the append-only file has survives."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


@contextlib.contextmanager
def private_redis(*, appendonly: bool = True) -> Iterator[PrivateRedis]:
    with tempfile.TemporaryDirectory(prefix="epochal-redis-") as tmp:
        server = PrivateRedis(Path(tmp), appendonly=appendonly)
        server.start()
        try:
            yield server
        finally:
            server.stop()


#: the shared RabbitMQ as `bin/services` runs it: its node and the CLI that reaches it (Debian's
#: /usr/sbin/rabbitmqctl runs as the rabbitmq user, whose Erlang cookie is not the node's)
RABBITMQ_NODE = "epochal@localhost"
RABBITMQCTL = Path("/usr/lib/rabbitmq/bin/rabbitmqctl")


class RabbitMQVhost:
    """A vhost of its own on the shared RabbitMQ (`amqp_url` names the node and the user),
    reached through a `TcpProxy`: its queues collide with no one else's, and the broker's
    outage is the proxy's. `stop` aborts every connection and each new one with an RST (the
    broker crashed or restarts); `start` lets them through again. What the broker holds
    survives, as it survives a RabbitMQ restart (Celery's queues are durable, its messages
    persistent). The shared node itself is never stopped."""

    def __init__(self, amqp_url: str) -> None:
        require_service("rabbitmqctl", RABBITMQCTL.exists(), "install rabbitmq-server")
        parts = urlsplit(amqp_url)
        self.user = unquote(parts.username or "guest")
        self.password = unquote(parts.password or "guest")
        self.vhost = f"epochal-faults-{uuid.uuid4().hex[:12]}"
        self.proxy = TcpProxy((parts.hostname or "127.0.0.1", parts.port or 5672))
        self.port = 0

    def _ctl(self, *args: str) -> None:
        subprocess.run([str(RABBITMQCTL), "-n", RABBITMQ_NODE, *args],
                       check=True, capture_output=True, timeout=60)  # fmt: skip

    def url(self) -> str:
        return (f"amqp://{quote(self.user, safe='')}:{quote(self.password, safe='')}"
                f"@127.0.0.1:{self.port}/{quote(self.vhost, safe='')}")  # fmt: skip

    def create(self) -> None:
        self._ctl("add_vhost", self.vhost)
        self._ctl("set_permissions", "-p", self.vhost, self.user, ".*", ".*", ".*")
        self.port = self.proxy.start().port

    def delete(self) -> None:
        self.proxy.stop()
        self._ctl("delete_vhost", self.vhost)

    def stop(self) -> None:
        self.proxy.reset()

    def start(self) -> None:
        self.proxy.passthrough()


@contextlib.contextmanager
def rabbitmq_vhost(amqp_url: str) -> Iterator[RabbitMQVhost]:
    broker = RabbitMQVhost(amqp_url)
    try:
        broker.create()
        yield broker
    finally:
        broker.delete()
