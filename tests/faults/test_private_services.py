"""The fault suite's own servers, which a test may stop: a private PostgreSQL (initdb on a free
port) stopped as by a crash and started again with its data, sessions cut with
pg_terminate_backend; a private redis-server killed and restarted with its append-only file.
The TCP proxy cuts, resets and delays traffic to a real server."""

from __future__ import annotations

import socket
import time

import psycopg
import pytest
import redis

from tests.faults.private_services import private_postgres, private_redis
from tests.faults.tcp_proxy import TcpProxy

pytestmark = pytest.mark.faults


def test_private_postgres_stops_and_restarts_with_its_data() -> None:
    with private_postgres() as server:
        server.create_database("faults")
        url = server.database_url("faults")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (n int)")
            conn.execute("INSERT INTO t VALUES (1)")
        with psycopg.connect(url, autocommit=True) as victim:
            server.terminate_backends("faults")
            with pytest.raises(psycopg.OperationalError):
                victim.execute("SELECT 1")
        server.stop()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(url, connect_timeout=2)
        server.start()
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT n FROM t").fetchall() == [(1,)]


def test_private_redis_restarts_with_its_append_only_file() -> None:
    with private_redis() as server:
        client = redis.Redis.from_url(server.url())
        client.set("k", "v")
        server.restart()
        assert redis.Redis.from_url(server.url()).get("k") == b"v"


def test_tcp_proxy_cuts_resets_and_delays() -> None:
    with private_redis(appendonly=False) as server, TcpProxy(("127.0.0.1", server.port)) as proxy:
        through = redis.Redis(port=proxy.port, socket_timeout=2)
        assert through.ping()
        proxy.delay(0.3)
        began = time.monotonic()
        assert through.ping()
        assert time.monotonic() - began >= 0.3
        for fault in (proxy.cut, proxy.reset):
            fault()
            with pytest.raises(redis.ConnectionError):
                redis.Redis(port=proxy.port, socket_timeout=2).ping()
            proxy.passthrough()
            assert redis.Redis(port=proxy.port, socket_timeout=2).ping()
        assert proxy.connections >= 4
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=2):
            pass
