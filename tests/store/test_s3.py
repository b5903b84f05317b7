"""S3 specifics: URL parsing, what happens on a server that ignores conditional writes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from snapshots_store import Repository, StoreConfigError, check_repository, open_backend
from snapshots_store.backends.s3 import S3Backend
from tests.faults.s3_proxy import faulty_s3

from .helpers import commit_chain, manifest


@pytest.fixture
def careless_server(s3_endpoint: str) -> Iterator[str]:
    """An S3 "server" that ignores If-Match / If-None-Match: forwards to moto without them."""
    with faulty_s3(s3_endpoint, drop_headers=("if-match", "if-none-match")) as proxy:
        yield proxy.endpoint


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
