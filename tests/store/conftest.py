"""Fixtures of the store suite: real repositories on a temp directory and on a moto S3
server spoken to over HTTP by boto3 (no patched clients)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from moto.server import ThreadedMotoServer
from werkzeug.serving import make_server

from snapshots_store import Repository

S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class AtomicMotoServer(ThreadedMotoServer):
    """moto over real HTTP, with S3's atomic conditional writes.

    moto checks If-Match / If-None-Match and then writes in two separate steps, so two
    racing requests can both pass the check; AWS S3 decides such races atomically. This
    server handles one request at a time (connections stay concurrent), which restores
    that guarantee: the race tests then exercise our client, not moto's check-then-write.
    """

    def _server_entry(self) -> None:
        app = DomainDispatcherApplication(create_backend_app)
        lock = threading.Lock()

        def serialised(environ: Any, start_response: Any) -> list[bytes]:
            with lock:
                return list(app(environ, start_response))

        self._server = make_server(
            self._ip_address, self._port, serialised, True, request_handler=MotoRequestHandler
        )
        self._server_ready_event.set()
        self._server.serve_forever()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 for the whole session; its URL."""
    os.environ.update(S3_ENV)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one log line per request
    port = _free_port()
    server = AtomicMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_url(s3_endpoint: str) -> str:
    """A store URL on a fresh bucket of the moto server."""
    bucket = f"store-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(
        Bucket=bucket
    )
    return f"s3://{bucket}/root?endpoint_url={s3_endpoint}"


@pytest.fixture
def local_root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store_url(local_root: Path) -> str:
    return local_root.as_uri()


@pytest.fixture
def repo(store_url: str) -> Repository:
    return Repository.open(store_url, "app")


@pytest.fixture(params=["local", "s3"])
def any_url(request: pytest.FixtureRequest) -> str:
    """The store URL of each backend in turn (parity tests)."""
    if request.param == "local":
        return str(request.getfixturevalue("store_url"))
    return str(request.getfixturevalue("s3_url"))


@pytest.fixture
def any_repo(any_url: str) -> Repository:
    return Repository.open(any_url, "app")
