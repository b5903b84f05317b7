"""S3 specifics: URL parsing, what happens on a server that ignores conditional writes."""

from __future__ import annotations

import http.client
import http.server
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from snapshots_store import Repository, StoreConfigError, check_repository, open_backend
from snapshots_store.backends.s3 import S3Backend

from .helpers import commit_chain, manifest


class _HeaderStrippingProxy(http.server.ThreadingHTTPServer):
    """An S3 "server" that ignores If-Match / If-None-Match: forwards to moto without them."""

    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        super().__init__(("127.0.0.1", 0), _ProxyHandler)


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    server: _HeaderStrippingProxy
    protocol_version = "HTTP/1.1"  # answers boto3's "Expect: 100-continue" at once

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {
            k: v
            for k, v in self.headers.items()
            if k.lower() not in ("if-match", "if-none-match", "expect")
        }
        upstream = http.client.HTTPConnection(
            self.server.upstream.hostname or "127.0.0.1", self.server.upstream.port, timeout=30
        )
        upstream.request(self.command, self.path, body=body, headers=headers)
        response = upstream.getresponse()
        data = response.read()
        self.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(key, value)
        upstream_length = response.getheader("Content-Length")
        head = self.command == "HEAD" and upstream_length is not None
        self.send_header("Content-Length", str(upstream_length) if head else str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        upstream.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def careless_server(s3_endpoint: str) -> Iterator[str]:
    proxy = _HeaderStrippingProxy(s3_endpoint)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{proxy.server_address[1]}"
    finally:
        proxy.shutdown()


def test_server_ignoring_conditional_writes_is_refused_for_refs(
    s3_url: str, careless_server: str
) -> None:
    good = Repository.open(s3_url, "app")
    ids = commit_chain(good, 2)
    url = s3_url.split("?")[0] + f"?endpoint_url={careless_server}"
    careless = Repository.open(url, "app")
    # Reads and content-addressed objects work: they need no conditions.
    assert careless.read_ref("heads/main").target == ids[-1]  # type: ignore[union-attr]
    oid = careless.put_object("chunk", b"safe without conditions")
    assert good.get_object(oid) == b"safe without conditions"
    # Moving a ref would be a blind overwrite there: refused, and nothing is written.
    m = manifest(epoch=5, parents=(ids[-1],))
    with pytest.raises(StoreConfigError, match="ignores conditional writes"):
        careless.commit(m, "main", expected_head=ids[-1], reason="unsafe")
    with pytest.raises(StoreConfigError):
        careless.write_control("main", {"p": 1}, None)
    assert good.read_ref("heads/main").target == ids[-1]  # type: ignore[union-attr]
    assert [e.new for e in good.reflog("heads/main")] == ids
    assert list(good.backend.list("logs/refs/heads/main/")) != []
    assert check_repository(good).ok


def test_probe_passes_on_moto_and_leaves_nothing_behind(s3_url: str) -> None:
    backend = open_backend(s3_url)
    assert isinstance(backend, S3Backend)
    assert backend.put_if_absent("k", b"v") is not None
    assert backend.conditional_writes_ok is True
    assert [info.key for info in backend.list("")] == ["k"]


def test_s3_url_parts(s3_endpoint: str) -> None:
    backend = open_backend(f"s3://my-bucket/a/b/?endpoint_url={s3_endpoint}&region=eu-west-1")
    assert isinstance(backend, S3Backend)
    assert (backend.bucket, backend.prefix) == ("my-bucket", "a/b")
    assert open_backend("s3://my-bucket").prefix == ""  # type: ignore[attr-defined]


def test_objects_are_single_puts_so_nothing_is_ever_partial(s3_url: str) -> None:
    repo = Repository.open(s3_url, "app")
    commit_chain(repo, 2)
    assert list(repo.backend.list_partial("")) == []
