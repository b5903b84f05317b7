"""Disk full on the store's filesystem and on the state cache's (each a small tmpfs of its own):
the commit that cannot be written fails cleanly naming the store, the branch head stays at the
last good snapshot, no partial file is left, fsck is clean, and once space is back the next
commit succeeds; a full cache directory only costs cache misses: the state is read from the
store and equals what was committed."""

from __future__ import annotations

import os
import time

import pytest

from runners import config
from runners.engine.state import memory_cache
from runners.engine.state.restore import load_key_group
from snapshots_store import Repository, StoreFullError, check_repository
from tests.faults.report import injections, record
from tests.faults.small_disk import fill, grow, small_disk
from tests.store.helpers import manifest

pytestmark = pytest.mark.faults


def test_a_commit_that_does_not_fit_fails_cleanly_and_the_head_stays() -> None:
    wanted = injections()
    recover_s: list[float] = []
    size_kib = 768
    with small_disk(size_kib) as disk:
        repo = Repository.open(f"file://{disk / 'store'}", "full")
        head: str | None = None
        good = failures = epoch = 0
        while failures < wanted:
            assert epoch < 40 * wanted, "the store never filled up"
            payload = os.urandom(96 * 1024)  # incompressible state: the disk fills in a few
            try:
                chunk = repo.put_chunks({epoch % 8: payload})[epoch % 8]
                m = manifest(epoch=epoch, parents=(head,) if head else (), key_groups={0: [chunk]})
                head = repo.commit(m, "main", expected_head=head, reason=f"epoch {epoch}")
                good += 1
            except StoreFullError as exc:
                failures += 1
                assert str(disk) in str(exc) and "full" in str(exc), exc
                assert repo.resolve("main") == head  # the head stays at the last good one
                assert not list(repo.backend.list_partial(""))  # no partial file left
                report = check_repository(repo)
                assert report.ok, report.to_dict()
                began = time.monotonic()
                size_kib += 512
                grow(disk, size_kib)  # the operator grows the volume; the next commit fits
                recover_s.append(time.monotonic() - began)
            epoch += 1
        assert good >= 2
        chain = [sid for sid, _ in repo.log("heads/main", first_parent=True)]
        assert chain[0] == head and len(chain) == good  # every commit reported is there, once
        assert check_repository(repo).ok
    record("disk_full_store", injected=failures, survived=failures, lost=0, duplicated=0,
           recover_s=recover_s)  # fmt: skip


def test_a_full_state_cache_degrades_to_store_reads(
    reference: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    head = reference.read_manifest(reference.resolve("main"))
    expected = {
        group: load_key_group(reference, chain, ("key",), use_cache=False).table
        for group, chain in head.key_groups.items()
    }
    with small_disk(256) as disk:
        cache = disk / "cache"
        cache.mkdir()
        fill(disk)
        monkeypatch.setenv(config.STATE_CACHE_DIR_ENV, str(cache))
        config.reload()
        memory_cache.cache_clear()  # this process's memory cache too: every read goes to the store
        misses = memory_cache.stats["misses"]
        for group, chain in head.key_groups.items():
            table = load_key_group(reference, chain, ("key",)).table
            assert table.equals(expected[group]), f"key group {group} read wrong"
        assert memory_cache.stats["misses"] - misses >= len(head.key_groups)
        assert not any(p.is_file() for p in cache.rglob("*"))  # nothing half-written
    record("disk_full_cache", injected=len(head.key_groups), survived=len(head.key_groups),
           lost=0, duplicated=0)  # fmt: skip
