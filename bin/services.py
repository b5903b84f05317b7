"""bin/services: the servers the tests, the benchmarks and the demo's service modes use.

    bin/services up [NAME ...]     install what is missing, start, wait until each answers
    bin/services down [NAME ...]   stop what `up` started
    bin/services status [NAME ...] one line per service (exit 1 when one does not answer)
    bin/services env               `export` lines: DATABASE_URL, REDIS_URL, RABBITMQ_URL, ...

NAME is one of postgresql, redis, rabbitmq, kafka (default: all). Every server listens on
loopback only and keeps its data under var/services/NAME (logs in var/services/NAME.log).
Debian's packages (postgresql, redis-server, rabbitmq-server, maven) are installed with apt
when missing; the Apache Kafka broker's jars come from Maven Central into var/cache/kafka/,
pinned to one version and checked against requirements/kafka-broker.sha256. `up` is
idempotent: a service that already answers on its port (started by an earlier `up`, or by
the machine) is left as it is and used. Only the standard library: this runs before .venv.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import pwd
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVICES_DIR = ROOT / "var" / "services"
CACHE_DIR = ROOT / "var" / "cache"
HOST = "127.0.0.1"
#: How long a server may take to answer after it was started (RabbitMQ is the slowest, ~10 s).
START_TIMEOUT_S = 120.0

KAFKA_VERSION = "4.1.1"
KAFKA_CHECKSUMS = ROOT / "requirements" / "kafka-broker.sha256"
KAFKA_PORT = 9092
KAFKA_CONTROLLER_PORT = 9093
POSTGRES_PORT = 5432
REDIS_PORT = 6379
AMQP_PORT = 5672
STREAM_PORT = 5552
RABBITMQ_NODE = "epochal@localhost"


class ServiceError(RuntimeError):
    """Something a user must act on; printed without a traceback."""


def say(message: str) -> None:
    print(f"services: {message}", file=sys.stderr, flush=True)


def run(cmd: Sequence[str], *, user: str | None = None, **kwargs: object) -> None:
    """Run a command to completion; `user` runs it as that system user when we are root."""
    if user and os.geteuid() == 0:
        cmd = ["runuser", "-u", user, "--", *cmd]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise ServiceError(f"`{' '.join(cmd)}` failed: " + " | ".join(detail))


def apt_install(packages: Sequence[str]) -> None:
    """Install Debian packages (root only: others are told what to run)."""
    wanted = " ".join(packages)
    if os.geteuid() != 0:
        raise ServiceError(f"missing {wanted}: run `sudo apt-get install -y {wanted}`")
    say(f"installing {wanted} (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], env=env)
    run(["apt-get", "install", "-y", "-qq", *packages], env=env)


def port_open(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def exchange(port: int, payload: bytes, want: int) -> bytes:
    """Send `payload` and read up to `want` bytes back (b"" when nothing answers)."""
    try:
        with socket.create_connection((HOST, port), timeout=2.0) as conn:
            conn.sendall(payload)
            data = b""
            while len(data) < want:
                chunk = conn.recv(want - len(data))
                if not chunk:
                    break
                data += chunk
            return data
    except OSError:
        return b""


def pid_alive(pid_file: Path) -> int | None:
    """The pid recorded in `pid_file` when that process still runs."""
    try:
        pid = int(pid_file.read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    return pid


def wait_for(what: str, check: Callable[[], bool], log: Path | None) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    tail = ""
    if log and log.exists():
        tail = "\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
    raise ServiceError(f"{what} did not answer within {START_TIMEOUT_S:.0f} s (log {log}){tail}")


def stop_pid(name: str, pid_file: Path, timeout_s: float = 60.0) -> None:
    pid = pid_alive(pid_file)
    if pid is None:
        say(f"{name}: not running (nothing started by bin/services)")
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and pid_alive(pid_file) == pid:
        time.sleep(0.2)
    if pid_alive(pid_file) == pid:
        os.kill(pid, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)
    say(f"{name}: stopped")


def spawn(cmd: Sequence[str], log: Path, pid_file: Path, env: dict[str, str] | None = None) -> None:
    """Start a server in its own session, detached from this terminal, logging to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    pid_file.write_text(f"{proc.pid}\n")


@dataclass
class Service:
    name: str
    address: str

    def answers(self) -> bool:
        raise NotImplementedError

    def up(self) -> None:
        raise NotImplementedError

    def down(self) -> None:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        raise NotImplementedError

    @property
    def dir(self) -> Path:
        return SERVICES_DIR / self.name

    @property
    def log(self) -> Path:
        return SERVICES_DIR / f"{self.name}.log"

    def ensure_up(self) -> None:
        if self.answers():
            say(f"{self.name}: already running on {self.address}")
            return
        started = time.monotonic()
        self.up()
        say(f"{self.name}: up on {self.address} ({time.monotonic() - started:.1f} s)")


class PostgreSQL(Service):
    """A cluster of Debian's PostgreSQL under var/services/postgresql, trust auth on loopback,
    the invoking user as superuser and a database `epochal`."""

    def __init__(self) -> None:
        super().__init__("postgresql", f"{HOST}:{POSTGRES_PORT}")
        self.superuser = pwd.getpwuid(os.geteuid()).pw_name
        # PostgreSQL refuses to run as root: as root, the server runs as the `postgres` user.
        self.server_user = "postgres" if os.geteuid() == 0 else None

    @staticmethod
    def bindir() -> Path | None:
        versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
        return versions[-1].parent if versions else None

    def answers(self) -> bool:
        # A startup packet for protocol 3.0 answered by anything PostgreSQL sends back
        # ('R' authentication, or 'E' error such as "database does not exist").
        body = struct.pack("!i", 196608) + b"user\0" + self.superuser.encode() + b"\0\0"
        reply = exchange(POSTGRES_PORT, struct.pack("!i", len(body) + 4) + body, 1)
        return reply[:1] in (b"R", b"E")

    def data_dir(self) -> Path:
        """var/services/postgresql, or (as root, when the `postgres` user cannot reach into
        this checkout) a directory under /var/lib/postgresql that it links to."""
        link = self.dir
        if link.is_symlink() or (link / "PG_VERSION").exists():
            return link.resolve()
        if self.server_user is None:
            return link
        link.mkdir(parents=True, exist_ok=True)
        shutil.chown(link, self.server_user, self.server_user)
        reachable = subprocess.run(
            ["runuser", "-u", self.server_user, "--", "test", "-w", str(link)], check=False
        )
        if reachable.returncode == 0:
            return link
        link.rmdir()
        digest = hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]
        target = Path("/var/lib/postgresql") / f"epochal-{digest}"
        target.mkdir(parents=True, exist_ok=True)
        shutil.chown(target, self.server_user, self.server_user)
        link.symlink_to(target)
        say(f"postgresql: the postgres user cannot reach {ROOT}; data in {target} (linked)")
        return target

    def up(self) -> None:
        bindir = self.bindir()
        if bindir is None:
            apt_install(["postgresql"])
            bindir = self.bindir()
            if bindir is None:
                raise ServiceError("postgresql installed but no /usr/lib/postgresql/*/bin")
        SERVICES_DIR.mkdir(parents=True, exist_ok=True)
        data = self.data_dir()
        if not (data / "PG_VERSION").exists():
            say(f"postgresql: initdb {data}")
            run(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    self.superuser,
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C.UTF-8",
                    "--no-instructions",
                ],
                user=self.server_user,
            )
        log = self.log
        if not data.is_relative_to(SERVICES_DIR.resolve()):  # beside the data the server reaches
            log = data.with_name(f"{data.name}.log")
            if not self.log.is_symlink():
                self.log.unlink(missing_ok=True)
                self.log.symlink_to(log)
        log.touch()
        if self.server_user:
            shutil.chown(log, self.server_user, self.server_user)
        options = (
            f"-c listen_addresses={HOST} -c port={POSTGRES_PORT} -c unix_socket_directories='' "
            "-c max_connections=300"
        )
        run(
            [str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "start"],
            user=self.server_user,
        )
        wait_for("postgresql", self.answers, log)
        self.create_database("epochal")

    def create_database(self, name: str) -> None:
        psql = ["psql", "-h", HOST, "-p", str(POSTGRES_PORT), "-U", self.superuser, "-d"]
        exists = subprocess.run(
            [*psql, "postgres", "-tAc", f"SELECT 1 FROM pg_database WHERE datname = '{name}'"],
            capture_output=True,
            text=True,
            check=False,
        )
        if exists.stdout.strip() != "1":
            run([*psql, "postgres", "-c", f'CREATE DATABASE "{name}"'])

    def down(self) -> None:
        bindir = self.bindir()
        data = self.dir.resolve()
        if bindir is None or not (data / "postmaster.pid").exists():
            say("postgresql: not running (nothing started by bin/services)")
            return
        stop = [str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]
        run(stop, user=self.server_user)
        say("postgresql: stopped")

    def env(self) -> dict[str, str]:
        return {"DATABASE_URL": f"postgres://{self.superuser}@{HOST}:{POSTGRES_PORT}/epochal"}


class Redis(Service):
    def __init__(self) -> None:
        super().__init__("redis", f"{HOST}:{REDIS_PORT}")

    def answers(self) -> bool:
        return exchange(REDIS_PORT, b"PING\r\n", 5) == b"+PONG"

    def up(self) -> None:
        if shutil.which("redis-server") is None:
            apt_install(["redis-server"])
        self.dir.mkdir(parents=True, exist_ok=True)
        pid_file = self.dir / "redis.pid"
        cmd = ["redis-server", "--bind", HOST, "--port", str(REDIS_PORT), "--save", ""]
        cmd += ["--appendonly", "no", "--dir", str(self.dir), "--daemonize", "no"]
        spawn(cmd, self.log, pid_file)
        wait_for("redis", self.answers, self.log)

    def down(self) -> None:
        stop_pid("redis", self.dir / "redis.pid")

    def env(self) -> dict[str, str]:
        return {"REDIS_URL": f"redis://{HOST}:{REDIS_PORT}/0"}


class RabbitMQ(Service):
    """Debian's RabbitMQ as node epochal@localhost, with the stream plugin (port 5552)."""

    SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")

    def __init__(self) -> None:
        super().__init__("rabbitmq", f"{HOST}:{AMQP_PORT} (streams {STREAM_PORT})")

    def answers(self) -> bool:
        # AMQP 0-9-1 protocol header, answered by a Connection.Start method frame (type 1).
        amqp = exchange(AMQP_PORT, b"AMQP\x00\x00\x09\x01", 1) == b"\x01"
        return amqp and port_open(STREAM_PORT)

    def server_env(self) -> dict[str, str]:
        base = self.dir
        return {
            **os.environ,
            "RABBITMQ_NODENAME": RABBITMQ_NODE,
            "RABBITMQ_NODE_IP_ADDRESS": HOST,
            "RABBITMQ_NODE_PORT": str(AMQP_PORT),
            "RABBITMQ_DIST_PORT": "25672",
            "ERL_EPMD_ADDRESS": HOST,
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_PID_FILE": str(base / "rabbitmq.pid"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
        }

    def up(self) -> None:
        if not self.SERVER.exists():
            apt_install(["rabbitmq-server"])
        base = self.dir
        (base / "log").mkdir(parents=True, exist_ok=True)
        (base / "enabled_plugins").write_text("[rabbitmq_stream].\n")
        (base / "rabbitmq.conf").write_text(
            f"stream.listeners.tcp.1 = {HOST}:{STREAM_PORT}\n"
            f"stream.advertised_host = {HOST}\n"
            f"stream.advertised_port = {STREAM_PORT}\n"
        )
        spawn([str(self.SERVER)], self.log, base / "launcher.pid", env=self.server_env())
        wait_for("rabbitmq", self.answers, self.log)

    def down(self) -> None:
        ctl = self.SERVER.with_name("rabbitmqctl")
        if not self.answers() or not ctl.exists():
            stop_pid("rabbitmq", self.dir / "launcher.pid")
            return
        run([str(ctl), "-n", RABBITMQ_NODE, "stop"], env=self.server_env())
        (self.dir / "launcher.pid").unlink(missing_ok=True)
        say("rabbitmq: stopped")

    def env(self) -> dict[str, str]:
        return {
            "RABBITMQ_URL": f"amqp://guest:guest@{HOST}:{AMQP_PORT}//",
            "RABBITMQ_STREAM_URL": f"rabbitmq-stream://guest:guest@{HOST}:{STREAM_PORT}/%2F",
        }


def kafka_api_versions_ok(port: int) -> bool:
    """A Kafka ApiVersions request (v0) answered with error code 0: the broker serves."""
    client = b"epochal-services"
    body = struct.pack("!hhih", 18, 0, 7, len(client)) + client
    reply = exchange(port, struct.pack("!i", len(body)) + body, 10)
    if len(reply) < 10:
        return False
    _size, correlation, error = struct.unpack("!iih", reply[:10])
    return correlation == 7 and error == 0


class Kafka(Service):
    """The Apache Kafka broker (KRaft: broker and controller in one JVM) from Maven Central."""

    def __init__(self) -> None:
        super().__init__("kafka", f"{HOST}:{KAFKA_PORT}")

    @property
    def lib(self) -> Path:
        return CACHE_DIR / "kafka" / KAFKA_VERSION / "lib"

    def answers(self) -> bool:
        return kafka_api_versions_ok(KAFKA_PORT)

    def fetch(self) -> None:
        """The broker's jars, fetched once with Maven and checked against the pinned sums."""
        expected = dict(
            reversed(line.split()) for line in KAFKA_CHECKSUMS.read_text().splitlines() if line
        )
        if self.lib.is_dir() and self.verify(expected, quiet=True):
            return
        if shutil.which("mvn") is None:
            apt_install(["maven"])
        work = self.lib.parent
        shutil.rmtree(self.lib, ignore_errors=True)
        work.mkdir(parents=True, exist_ok=True)
        (work / "pom.xml").write_text(
            '<project xmlns="http://maven.apache.org/POM/4.0.0">\n'
            "  <modelVersion>4.0.0</modelVersion>\n"
            "  <groupId>epochal</groupId><artifactId>kafka-broker</artifactId>"
            "<version>1</version><packaging>pom</packaging>\n"
            "  <dependencies><dependency><groupId>org.apache.kafka</groupId>"
            f"<artifactId>kafka_2.13</artifactId><version>{KAFKA_VERSION}</version>"
            "</dependency></dependencies>\n"
            "</project>\n"
        )
        say(f"kafka: fetching kafka_2.13 {KAFKA_VERSION} and its dependencies (Maven)")
        run(
            ["mvn", "-q", "-B", "dependency:copy-dependencies", f"-DoutputDirectory={self.lib}"],
            cwd=work,
        )
        if not self.verify(expected, quiet=False):
            shutil.rmtree(self.lib, ignore_errors=True)
            raise ServiceError(f"kafka: fetched jars do not match {KAFKA_CHECKSUMS}")

    def verify(self, expected: dict[str, str], *, quiet: bool) -> bool:
        found = {p.name: p for p in self.lib.glob("*.jar")}
        if set(found) != set(expected):
            if not quiet:
                say(f"kafka: jar set differs: {sorted(set(found) ^ set(expected))}")
            return False
        for name, path in found.items():
            if hashlib.sha256(path.read_bytes()).hexdigest() != expected[name]:
                if not quiet:
                    say(f"kafka: checksum mismatch for {name}")
                return False
        return True

    def up(self) -> None:
        self.fetch()
        data = self.dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.dir / "server.properties"
        config.write_text(
            "process.roles=broker,controller\n"
            "node.id=1\n"
            f"controller.quorum.voters=1@{HOST}:{KAFKA_CONTROLLER_PORT}\n"
            f"listeners=PLAINTEXT://{HOST}:{KAFKA_PORT},CONTROLLER://{HOST}:{KAFKA_CONTROLLER_PORT}\n"
            f"advertised.listeners=PLAINTEXT://{HOST}:{KAFKA_PORT}\n"
            "controller.listener.names=CONTROLLER\n"
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT\n"
            "inter.broker.listener.name=PLAINTEXT\n"
            f"log.dirs={data}\n"
            "num.partitions=1\n"
            "offsets.topic.replication.factor=1\n"
            "transaction.state.log.replication.factor=1\n"
            "transaction.state.log.min.isr=1\n"
            "share.coordinator.state.topic.replication.factor=1\n"
            "share.coordinator.state.topic.min.isr=1\n"
            "group.initial.rebalance.delay.ms=0\n"
            "auto.create.topics.enable=false\n"
        )
        java = ["java", "-cp", f"{self.lib}/*"]
        if not (data / "meta.properties").exists():
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode()[:22]
            run([*java, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config)])
        heap = ["-Xms256m", "-Xmx1g", "-XX:+UseG1GC", "-Djava.awt.headless=true"]
        cmd = ["java", *heap, "-cp", f"{self.lib}/*", "kafka.Kafka", str(config)]
        spawn(cmd, self.log, self.dir / "kafka.pid")
        wait_for("kafka", self.answers, self.log)

    def down(self) -> None:
        stop_pid("kafka", self.dir / "kafka.pid")

    def env(self) -> dict[str, str]:
        return {"KAFKA_BOOTSTRAP_SERVERS": f"{HOST}:{KAFKA_PORT}"}


SERVICES: dict[str, Callable[[], Service]] = {
    "postgresql": PostgreSQL,
    "redis": Redis,
    "rabbitmq": RabbitMQ,
    "kafka": Kafka,
}


def chosen(names: Sequence[str]) -> list[Service]:
    unknown = [n for n in names if n not in SERVICES]
    if unknown:
        choices = ", ".join(SERVICES)
        raise ServiceError(f"unknown service {', '.join(unknown)}: choose from {choices}")
    return [SERVICES[n]() for n in (names or list(SERVICES))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bin/services",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=["up", "down", "status", "env"])
    parser.add_argument("names", nargs="*", metavar="NAME", help=", ".join(SERVICES))
    args = parser.parse_args(argv)
    try:
        services = chosen(args.names)
        if args.command == "up":
            for service in services:
                service.ensure_up()
        elif args.command == "down":
            for service in reversed(services):
                service.down()
        elif args.command == "status":
            failing = 0
            for service in services:
                ok = service.answers()
                failing += not ok
                print(f"{service.name:<11} {'up' if ok else 'down':<5} {service.address}")
            return 1 if failing else 0
        else:
            for service in services:
                for key, value in service.env().items():
                    print(f"export {key}={value}")
    except ServiceError as err:
        say(str(err))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
