"""Damaged objects at rest in a store the engine wrote (a flipped byte in a state pack, a
truncated manifest, a missing chunk): the snapshot check names the object and the snapshot, fsck
lists the damage, the newest intact snapshot to roll back to is found, and a job restoring the
damaged head refuses it with that reason (exit status 5) instead of reading wrong state."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from runners.engine.sources import Generator, write_parquet_file
from runners.engine.store_faults import DAMAGED_SNAPSHOT_EXIT
from snapshots_store import (
    Repository,
    check_repository,
    check_snapshot,
    newest_intact_on_branch,
)
from snapshots_store.objects import object_key
from snapshots_store.packs import split_ref
from tests.engine.crash_harness import run_job
from tests.faults.conftest import EPOCHS
from tests.faults.report import injections, record

pytestmark = [pytest.mark.spark, pytest.mark.faults]


def _copy(reference: Repository, tmp_path: Path) -> tuple[str, Repository]:
    source = Path(reference.backend.url.removeprefix("file://")).parent
    tmp_path.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, tmp_path / "store")
    url = f"file://{tmp_path / 'store'}"
    return url, Repository.open(url, "crash")


def _new_pack(repo: Repository) -> str:
    """A state pack the head names and its parent does not (written by the last epoch)."""
    head = repo.read_manifest(repo.resolve("main"))
    parent = repo.read_manifest(head.parents[0])
    for group, chain in sorted(head.key_groups.items()):
        if parent.key_groups.get(group) != chain:
            return split_ref(chain[-1])[0]
    raise AssertionError("the last epoch wrote no state")


def flip_pack_byte(repo: Repository) -> str:
    pack = _new_pack(repo)
    key = object_key(pack)
    blob = repo.backend.get(key)
    assert blob is not None
    data = bytearray(blob.data)
    data[len(data) // 2] ^= 0x01
    repo.backend.put(key, bytes(data))
    return pack


def truncate_head_manifest(repo: Repository) -> str:
    head = repo.resolve("main")
    blob = repo.backend.get(object_key(head))
    assert blob is not None
    repo.backend.put(object_key(head), blob.data[: len(blob.data) // 2])
    return head


def delete_pack(repo: Repository) -> str:
    pack = _new_pack(repo)
    repo.backend.delete(object_key(pack))
    return pack


DAMAGE: dict[str, Callable[[Repository], str]] = {
    "flipped byte in a pack": flip_pack_byte,
    "truncated manifest": truncate_head_manifest,
    "missing chunk": delete_pack,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damage_is_named_and_the_newest_intact_snapshot_found(
    reference: Repository, tmp_path: Path, damage: str
) -> None:
    recover_s = []
    rounds = injections()
    for n in range(rounds):  # each round on a fresh copy of the store the engine wrote
        _, repo = _copy(reference, tmp_path / f"round-{n}")
        head = repo.resolve("main")
        parent = reference.read_manifest(head).parents[0]
        damaged = DAMAGE[damage](repo)
        began = time.monotonic()
        fresh = Repository.open(repo.backend.url.rsplit("/", 1)[0], "crash")  # nothing cached
        problems = check_snapshot(fresh, head)
        assert problems, f"{damage}: not detected"
        assert all(p.snapshot_id == head for p in problems)
        assert any(p.object_id == damaged for p in problems), problems
        assert damaged in problems[0].message and head in problems[0].message
        report = check_repository(fresh)
        assert not report.ok and any(p.object_id == damaged for p in report.problems)
        assert newest_intact_on_branch(fresh, "main") == parent
        assert not check_snapshot(fresh, parent)
        recover_s.append(time.monotonic() - began)  # from the damage to the rollback target
    record("damaged_object", injected=rounds, survived=rounds, lost=0, duplicated=0,
           recover_s=recover_s)  # fmt: skip


@pytest.mark.slow  # a job process of its own (~35 s under load): python -m bench.faults runs it
def test_a_job_refuses_to_restore_a_damaged_head_naming_it(
    reference: Repository, fault_data: str, tmp_path: Path
) -> None:
    url, repo = _copy(reference, tmp_path)
    head = repo.resolve("main")
    parent = reference.read_manifest(head).parents[0]
    pack = flip_pack_byte(repo)
    data = tmp_path / "in"
    shutil.copytree(fault_data, data)  # one epoch more to run, so the job restores its state
    block = Generator(keys=120, records_per_epoch=700, seed=29).block(EPOCHS)
    write_parquet_file(str(data), f"part-{EPOCHS:05d}", block)
    cache = tmp_path / "cache"  # a machine that has not cached the state: it reads the store
    run = run_job(store=url, namespace="crash", data=str(data), max_epochs=1,
                  extra_env={"EPOCHAL_STATE_CACHE_DIR": str(cache)})  # fmt: skip
    assert run.returncode == DAMAGED_SNAPSHOT_EXIT, run.events
    reason = str(run.events[-1]["reason"])
    assert head in reason and pack in reason and "cannot be restored" in reason, reason
    assert f"roll back to the newest intact ancestor {parent}" in reason, reason
    assert run.committed == [] and repo.resolve("main") == head  # nothing read wrong, nothing moved
