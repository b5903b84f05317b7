"""Object-store faults between the store and a real S3 server (moto over HTTP, behind a fault
proxy): 500s, 503 SlowDown, connections reset before or after the server acted, answers held
past the read timeout. The store retries with jittered backoff within its budget, never reports
a write that is not on the server, and names the store when the budget runs out."""

from __future__ import annotations

import time

import pytest

from snapshots_store import Repository, StoreUnavailableError, check_repository, open_backend
from snapshots_store.backends.retry import RetryPolicy
from snapshots_store.backends.s3 import S3Backend
from tests.faults.report import injections, record
from tests.faults.s3_proxy import KINDS, FaultyS3Proxy
from tests.store.helpers import manifest

pytestmark = pytest.mark.faults


def test_commits_through_random_faults_are_all_durable_and_none_twice(
    proxied_store: str, s3_proxy: FaultyS3Proxy
) -> None:
    repo = Repository.open(proxied_store, "faults")
    wanted = injections()
    s3_proxy.rate = 0.2
    head: str | None = None
    payloads: dict[str, bytes] = {}
    commits: list[str] = []
    recover_s: list[float] = []
    epoch = 0
    while min(s3_proxy.injected[k] for k in KINDS) < wanted:
        assert epoch < 60 * wanted, f"too few faults drawn: {s3_proxy.injected}"
        before = sum(s3_proxy.injected.values())
        began = time.monotonic()
        payload = f"chunk {epoch}".encode() * 50
        chunk = repo.put_object("chunk", payload)
        m = manifest(epoch=epoch, parents=(head,) if head else (), key_groups={0: [chunk]})
        head = repo.commit(m, "main", expected_head=head, reason=f"epoch {epoch}")
        assert repo.get_object(chunk) == payload  # read back through the faults too
        if sum(s3_proxy.injected.values()) > before:
            recover_s.append(time.monotonic() - began)
        payloads[chunk] = payload
        commits.append(head)
        epoch += 1
    s3_proxy.rate = 0.0
    # every commit reported is on the server, in order, once: read without the proxy
    direct = Repository.open(proxied_store.split("?")[0] + f"?endpoint_url={_upstream(s3_proxy)}",
                             "faults")  # fmt: skip
    chain = [snapshot for snapshot, _ in direct.log("heads/main", first_parent=True)]
    assert chain == commits[::-1]
    for chunk, payload in payloads.items():
        assert direct.get_object(chunk) == payload
    report = check_repository(direct)
    assert report.ok, report.to_dict()
    injected = sum(s3_proxy.injected.values())
    record("object_store", injected=injected, survived=injected, lost=0, duplicated=0,
           recover_s=recover_s)  # fmt: skip


def _upstream(proxy: FaultyS3Proxy) -> str:
    return f"http://{proxy.upstream.hostname}:{proxy.upstream.port}"


def test_a_conditional_write_whose_answer_was_lost_is_settled_not_doubted(
    proxied_store: str, s3_proxy: FaultyS3Proxy
) -> None:
    backend = open_backend(proxied_store)
    assert isinstance(backend, S3Backend)
    assert backend.put_if_absent("probe-first", b"x") is not None  # the capability probe
    s3_proxy.script("PUT", "reset-after")  # the create happens, its answer is lost
    created = backend.put_if_absent("refs/heads/main", b"ref 1")
    assert created is not None, "our own create, retried, was taken for someone else's"
    assert s3_proxy.injected["reset"] == 1
    s3_proxy.script("PUT", "reset-after")
    moved = backend.put_if_match("refs/heads/main", b"ref 2", created)
    assert moved is not None
    blob = backend.get("refs/heads/main")
    assert blob is not None and blob.data == b"ref 2" and blob.version == moved
    # a real conflict is still one: a stale version, and a create over an existing key
    assert backend.put_if_match("refs/heads/main", b"ref 3", created) is None
    assert backend.put_if_absent("refs/heads/main", b"ref 4") is None
    assert backend.get("refs/heads/main").data == b"ref 2"  # type: ignore[union-attr]


def test_after_the_budget_the_error_names_the_store_and_nothing_moved(
    proxied_store: str, s3_proxy: FaultyS3Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = Repository.open(proxied_store, "faults")
    first = repo.commit(manifest(epoch=0), "main", expected_head=None, reason="epoch 0")
    monkeypatch.setenv("EPOCHAL_STORE_RETRY_BUDGET_S", "1.5")
    repo = Repository.open(proxied_store, "faults")
    s3_proxy.pause()
    began = time.monotonic()
    with pytest.raises(StoreUnavailableError) as raised:
        repo.commit(manifest(epoch=1, parents=(first,)), "main", expected_head=first,
                    reason="epoch 1")  # fmt: skip
    elapsed = time.monotonic() - began
    s3_proxy.resume()
    message = str(raised.value)
    assert proxied_store.split("?")[0].removeprefix("s3://") in message, message
    assert "SlowDown" in message and "unavailable" in message
    assert raised.value.attempts >= 2
    assert elapsed < 1.5 + 2, elapsed  # bounded: the budget plus one request's timeout
    assert repo.resolve("main") == first  # the head stayed at the last good snapshot
    assert check_repository(repo).ok


def test_the_retry_policy_is_configured_from_the_environment() -> None:
    policy = RetryPolicy.from_env({"EPOCHAL_STORE_RETRY_BUDGET_S": "7.5",
                                   "EPOCHAL_STORE_RETRY_ATTEMPTS": "3"})  # fmt: skip
    assert (policy.budget_s, policy.attempts) == (7.5, 3)
    with pytest.raises(Exception, match="EPOCHAL_STORE_RETRY_ATTEMPTS='many' is not an integer"):
        RetryPolicy.from_env({"EPOCHAL_STORE_RETRY_ATTEMPTS": "many"})
    with pytest.raises(Exception, match="EPOCHAL_STORE_RETRY_BUDGET_S must be > 0"):
        RetryPolicy.from_env({"EPOCHAL_STORE_RETRY_BUDGET_S": "0"})
    import random

    waits = [policy.wait_s(n, random.Random(n)) for n in range(10)]
    assert all(0 <= w <= min(policy.cap_s, policy.base_s * 2**n) for n, w in enumerate(waits))
