"""A private Kafka broker for tests that stop and restart it (never the shared one that
`bin/services up` starts): the same Apache Kafka jars (var/cache/kafka/<version>/lib, fetched
by `bin/services up`; $EPOCHAL_KAFKA_LIB overrides), KRaft with broker and controller in one
JVM, on two free loopback ports, data in a test's temporary directory."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIB_ENV = "EPOCHAL_KAFKA_LIB"


def broker_lib() -> Path | None:
    """The directory of the broker's jars, or None when `bin/services up` has not fetched
    them."""
    override = os.environ.get(LIB_ENV)
    candidates = [Path(override)] if override else sorted((ROOT / "var/cache/kafka").glob("*/lib"))
    for lib in reversed(candidates):
        if any(lib.glob("kafka_2.13-*.jar")):
            return lib
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PrivateBroker:
    """One KRaft broker+controller; `start`, `kill` (SIGKILL), `start` again on the same data."""

    def __init__(self, lib: Path, home: Path) -> None:
        self.lib, self.home = lib, home
        self.port, self.controller = _free_port(), _free_port()
        self.process: subprocess.Popen[bytes] | None = None
        home.mkdir(parents=True, exist_ok=True)
        self.config = home / "server.properties"
        self.config.write_text(
            "process.roles=broker,controller\nnode.id=1\n"
            f"controller.quorum.voters=1@127.0.0.1:{self.controller}\n"
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller}\n"
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}\n"
            "controller.listener.names=CONTROLLER\n"
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT\n"
            "inter.broker.listener.name=PLAINTEXT\n"
            f"log.dirs={home / 'data'}\nnum.partitions=1\n"
            "offsets.topic.replication.factor=1\noffsets.topic.num.partitions=2\n"
            "transaction.state.log.replication.factor=1\ntransaction.state.log.min.isr=1\n"
            "transaction.state.log.num.partitions=2\n"
            "share.coordinator.state.topic.replication.factor=1\n"
            "share.coordinator.state.topic.min.isr=1\n"
            "group.initial.rebalance.delay.ms=0\nauto.create.topics.enable=false\n"
        )
        cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode()[:22]
        subprocess.run(
            self._java("kafka.tools.StorageTool", "format", "-t", cluster, "-c", str(self.config)),
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip

    @property
    def servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _java(self, *args: str) -> list[str]:
        return ["java", "-Xmx384m", "-cp", f"{self.lib}/*", *args]

    def start(self, timeout: float = 120.0) -> None:
        log = open(self.home / "broker.log", "ab")  # noqa: SIM115 (the broker's, until it ends)
        self.process = subprocess.Popen(
            self._java("kafka.Kafka", str(self.config)),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the private broker did not start: see {self.home}/broker.log")
            time.sleep(0.2)

    def _answers(self) -> bool:
        from confluent_kafka.admin import AdminClient

        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            try:
                AdminClient({"bootstrap.servers": self.servers}).list_topics(timeout=2)
                return True
            except Exception:
                return False
        return False

    def kill(self) -> None:
        """SIGKILL the broker (its whole process group) and wait for it to end."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self.process = None
