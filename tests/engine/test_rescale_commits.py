"""Rescales are visible in the history: kind "rescale", and the operation that caused them."""

from __future__ import annotations

from typing import Any

import pytest

from runners.engine import EpochRunner
from snapshots_store import Repository
from tests.engine.jobs import aggregate_job

pytestmark = pytest.mark.spark


def _set_control(repo: Repository, doc: dict[str, Any]) -> None:
    _, version = repo.read_control("main")
    repo.write_control("main", doc, version)


def test_rescale_kind_and_operation_id_of_the_first_commit_that_applies_it(
    spark: Any, epochs_dir: str, repo: Repository
) -> None:
    runner = EpochRunner(spark, aggregate_job(epochs_dir), repo=repo, parallelism=2)

    def step() -> tuple[str, str | None, int]:
        result = runner.run_epoch()
        assert result is not None
        m = repo.read_manifest(result.snapshot_id)
        return m.kind, m.operation_id, m.parallelism

    assert step() == ("epoch", None, 2)
    _set_control(repo, {"parallelism": 3, "operation_id": "op-1"})
    assert step() == ("rescale", "op-1", 3)  # live rescale, first commit applying op-1
    assert step() == ("epoch", None, 3)  # same control document: op-1 already applied
    _set_control(repo, {"parallelism": 3, "operation_id": "op-2"})
    assert step() == ("epoch", "op-2", 3)  # an operation that does not change p
    _set_control(repo, {"operation_id": "op-2"})
    restarted = EpochRunner(spark, aggregate_job(epochs_dir), repo=repo, parallelism=1)
    result = restarted.run_epoch()  # rescale with restart
    assert result is not None
    head = repo.read_manifest(result.snapshot_id)
    assert (head.kind, head.operation_id, head.parallelism) == ("rescale", None, 1)
    assert head.extra["key"] == ["key"]
    log = repo.reflog("heads/main")
    assert [e.operation_id for e in log] == [None, "op-1", None, "op-2", None]
    assert log[1].reason == "epoch 2, rescaled to p=3"
