"""bin/services: the servers CI and developers start on a bare machine.

These run against what `bin/services up` started (CI runs it before the suite): `status`
reports every service up and answering its own protocol, `env` names what the tests read and
each URL reaches a live server, and a second `up` finds them running and starts nothing.
Elsewhere they skip, saying why, like every service-backed test.
"""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from urllib.parse import urlsplit

import pytest

from tests.conftest import require_service

ROOT = Path(__file__).resolve().parent.parent
SERVICES = ROOT / "bin" / "services"
WANTED = {
    "DATABASE_URL",
    "REDIS_URL",
    "RABBITMQ_URL",
    "RABBITMQ_STREAM_URL",
    "KAFKA_BOOTSTRAP_SERVERS",
}


def _services_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bin_services", ROOT / "bin" / "services.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bin_services", module)
    spec.loader.exec_module(module)
    return module


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SERVICES), *args], capture_output=True, text=True, timeout=300, check=False
    )


@pytest.fixture(scope="module")
def services_up() -> None:
    status = _run("status")
    require_service(
        "bin/services", status.returncode == 0, f"run `bin/services up` ({status.stdout.strip()})"
    )


def _env() -> dict[str, str]:
    lines = _run("env").stdout.splitlines()
    assert all(line.startswith("export ") for line in lines), lines
    return dict(line.removeprefix("export ").split("=", 1) for line in lines)


def test_env_names_every_service_url() -> None:
    assert set(_env()) == WANTED


def test_status_reports_each_service_up(services_up: None) -> None:
    status = _run("status")
    names = [line.split()[0] for line in status.stdout.splitlines()]
    assert names == ["postgresql", "redis", "rabbitmq", "kafka"]
    assert all(line.split()[1] == "up" for line in status.stdout.splitlines()), status.stdout


def test_each_url_reaches_its_server(services_up: None) -> None:
    import psycopg
    import redis

    env = _env()
    with psycopg.connect(env["DATABASE_URL"].replace("postgres://", "postgresql://")) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert redis.Redis.from_url(env["REDIS_URL"]).ping() is True
    for key in ("RABBITMQ_URL", "RABBITMQ_STREAM_URL"):
        parsed = urlsplit(env[key])
        with socket.create_connection((parsed.hostname, parsed.port), timeout=2):
            pass
    host, port = env["KAFKA_BOOTSTRAP_SERVERS"].split(":")
    assert _services_module().kafka_api_versions_ok(int(port)), host


def test_second_up_starts_nothing(services_up: None) -> None:
    again = _run("up")
    assert again.returncode == 0, again.stderr
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 4
    assert all("already running" in line for line in lines), lines


def test_unknown_service_is_refused_by_name() -> None:
    refused = _run("up", "mysql")
    assert refused.returncode == 1
    assert "unknown service mysql: choose from postgresql, redis, rabbitmq, kafka" in refused.stderr


def test_kafka_jars_are_pinned_by_checksum() -> None:
    module = _services_module()
    sums = (ROOT / "requirements" / "kafka-broker.sha256").read_text().splitlines()
    names = [line.split()[1] for line in sums]
    assert f"kafka_2.13-{module.KAFKA_VERSION}.jar" in names
    assert all(len(line.split()[0]) == 64 for line in sums)
