"""Bad input gets a clear error and leaves the store exactly as it was."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from snapshots_store import (
    InvalidNameError,
    MalformedManifestError,
    RefConflictError,
    RefNotFoundError,
    Repository,
    StoreConfigError,
    StoreError,
    UnknownRevisionError,
    open_backend,
)
from snapshots_store.backends import LocalBackend

from .helpers import commit_chain, listing, manifest

NAMES = ["../x", "/etc", "a/../../b", "x.lock", "", "a\0b", "..", "a/./b", "a\\b", "a/"]


def _operations(ids: list[str]) -> dict[str, Callable[[Repository, str], Any]]:
    head = ids[-1]
    return {
        "cas_ref heads": lambda r, n: r.cas_ref(f"heads/{n}", None, head, reason="x"),
        "cas_ref tags": lambda r, n: r.cas_ref(f"tags/{n}", None, head, reason="x"),
        "delete_ref": lambda r, n: r.delete_ref(f"heads/{n}", head, reason="x"),
        "read_ref": lambda r, n: r.read_ref(f"heads/{n}"),
        "reflog": lambda r, n: r.reflog(f"tags/{n}"),
        "commit": lambda r, n: r.commit(
            manifest(epoch=9, parents=(head,)), n, expected_head=head, reason="x"
        ),
        "write_control": lambda r, n: r.write_control(n, {"p": 1}, None),
        "read_control": lambda r, n: r.read_control(n),
        "resolve": lambda r, n: r.resolve(n),
    }


@pytest.mark.parametrize("name", NAMES)
def test_bad_names_raise_before_any_io_and_leave_the_store_untouched(
    repo: Repository, local_root: Path, name: str
) -> None:
    ids = commit_chain(repo, 2)
    before = listing(local_root)
    for label, operation in _operations(ids).items():
        with pytest.raises((InvalidNameError, UnknownRevisionError)) as excinfo:
            operation(repo, name)
        assert str(excinfo.value), label
    assert listing(local_root) == before


@pytest.mark.parametrize("prefix", ["../", "/etc", "heads/\0", "heads/../../x"])
def test_bad_list_prefixes_are_rejected(repo: Repository, prefix: str) -> None:
    with pytest.raises(InvalidNameError):
        repo.list_refs(prefix)


@pytest.mark.parametrize("name", NAMES)
def test_bad_manifest_branch_names_are_malformed_manifests(name: str) -> None:
    with pytest.raises(MalformedManifestError, match="`branch`"):
        manifest(branch=name)


def test_unknown_ref_and_revision(repo: Repository, local_root: Path) -> None:
    ids = commit_chain(repo, 2)
    before = listing(local_root)
    assert repo.read_ref("heads/nope") is None
    with pytest.raises(RefNotFoundError, match="heads/nope"):
        repo.reflog("heads/nope")
    with pytest.raises(RefNotFoundError):
        repo.delete_ref("heads/nope", ids[0], reason="x")
    for rev in ["nope", "tags/nope", "0" * 64, ids[0][:7], "main~9", "main^3"]:
        with pytest.raises(UnknownRevisionError, match="unknown revision"):
            repo.resolve(rev)
    for call in (lambda: repo.log("nope"), lambda: repo.diff("main", "nope")):
        with pytest.raises(UnknownRevisionError):
            call()
    assert listing(local_root) == before


def test_stale_expected_values_change_nothing(repo: Repository, local_root: Path) -> None:
    a, _ = commit_chain(repo, 2)
    v = repo.write_control("main", {"parallelism": 2}, None)
    repo.write_control("main", {"parallelism": 3}, v)
    before = listing(local_root)
    with pytest.raises(RefConflictError):
        repo.cas_ref("heads/main", a, a, reason="stale")
    with pytest.raises(RefConflictError):
        repo.delete_ref("heads/main", a, reason="stale")
    with pytest.raises(RefConflictError):
        repo.commit(manifest(epoch=5, parents=(a,)), "main", expected_head=None, reason="x")
    with pytest.raises(RefConflictError, match="control document of branch main"):
        repo.write_control("main", {"parallelism": 4}, v)
    after = listing(local_root)
    new_keys = set(after) - set(before)
    # Only the losing commit's manifest object may have been written (unreferenced; gc food).
    assert all(k.startswith("app/objects/") for k in new_keys)
    assert {k: after[k] for k in before} == before


def test_malformed_manifest_bytes_cannot_become_a_ref_target(
    repo: Repository, local_root: Path
) -> None:
    doc = manifest().to_dict()
    doc["max_parallelism"] = "many"
    bad = repo.put_object("manifest", json.dumps(doc).encode())
    before = listing(local_root)
    with pytest.raises(MalformedManifestError, match="`max_parallelism`") as excinfo:
        repo.cas_ref("heads/main", None, bad, reason="x")
    assert bad in str(excinfo.value)
    assert listing(local_root) == before


def test_non_manifest_commit_and_non_bytes_payloads(repo: Repository, local_root: Path) -> None:
    with pytest.raises(MalformedManifestError):
        repo.commit({"epoch": 1}, "main", expected_head=None, reason="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bytes"):
        repo.put_object("chunk", "text")  # type: ignore[arg-type]
    with pytest.raises(InvalidNameError, match=r"control/main.*plain JSON"):
        repo.write_control("main", {"bad": object()}, None)
    with pytest.raises(InvalidNameError, match="JSON object"):
        repo.write_control("main", ["not", "an", "object"], None)  # type: ignore[arg-type]
    assert listing(local_root) == {}


@pytest.mark.parametrize(
    "url",
    [
        "",
        "ftp://host/x",
        "s3://",
        "s3://bucket/p?colour=blue",
        "file:///tmp/x?query=1",
    ],
)
def test_bad_store_urls(url: str) -> None:
    with pytest.raises(StoreConfigError):
        open_backend(url)


def test_relative_file_url_is_relative_to_cwd(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    repo = Repository.open("file://var/store", "app")
    commit_chain(repo, 1)
    assert (tmp_path / "var" / "store" / "app" / "refs" / "heads" / "main").is_file()


def test_plain_path_is_a_local_store(tmp_path: Path) -> None:
    backend = open_backend(str(tmp_path / "plain"))
    assert isinstance(backend, LocalBackend)
    assert backend.root == tmp_path / "plain"


def test_missing_s3_bucket_is_a_config_error(s3_endpoint: str) -> None:
    repo = Repository.open(f"s3://no-such-bucket-here/x?endpoint_url={s3_endpoint}", "app")
    with pytest.raises(StoreError):
        repo.list_refs()


def test_every_error_is_a_store_error() -> None:
    for cls in (
        InvalidNameError,
        MalformedManifestError,
        RefConflictError,
        RefNotFoundError,
        StoreConfigError,
        UnknownRevisionError,
    ):
        assert issubclass(cls, StoreError)
