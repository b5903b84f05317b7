"""Event-time jobs run to the end on the shared SparkSession, and what their branches hold:
sorted output, the watermark of every epoch, dead letters, as bytes to compare runs with."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from runners.engine import EpochRunner, Job, read_dead_letters, read_output
from snapshots_store import Repository
from tests.engine.crash_harness import run_job


def run(
    spark: Any, job: Job, root: Path, name: str, p: int = 2, routing: str = "auto"
) -> Repository:
    repo = Repository.open(f"file://{root}/store", name)
    EpochRunner(spark, job, repo=repo, parallelism=p, routing=routing).run()
    return repo


def run_rescaled(spark: Any, job: Job, root: Path, name: str, plan: Sequence[int]) -> Repository:
    """One epoch per entry of `plan` at that parallelism (a live rescale when it changes, as
    the control plane's control document asks), then the rest to the end at the last one."""
    repo = Repository.open(f"file://{root}/store", name)
    runner = EpochRunner(spark, job, repo=repo, parallelism=plan[0])
    version = None
    for p in plan:
        version = repo.write_control("main", {"parallelism": p}, version)
        result = runner.run_epoch()
        assert result is not None and result.parallelism == p
    while runner.run_epoch() is not None:
        pass
    assert runner.stopped_reason == "no new data"
    return repo


def output(repo: Repository, sort: Sequence[str], branch: str = "main") -> pd.DataFrame:
    return read_output(repo, branch).to_pandas().sort_values(list(sort)).reset_index(drop=True)


def chain(repo: Repository, branch: str = "main") -> list[Any]:
    return [m for _, m in reversed(list(repo.log(f"heads/{branch}", first_parent=True)))]


def watermarks(repo: Repository, branch: str = "main") -> list[tuple[int, Any, Any, int]]:
    """(epoch, applied, watermark, late) of every epoch commit on the branch."""
    return [
        (m.epoch, m.extra["event_time"]["applied"], m.extra["event_time"]["watermark"],
         int(m.stats["late_records"]))
        for m in chain(repo, branch)
        if m.kind in ("epoch", "rescale")
    ]  # fmt: skip


def ipc(frame: pd.DataFrame) -> bytes:
    sink = pa.BufferOutputStream()
    table = pa.Table.from_pandas(frame, preserve_index=False)
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())


def dead_letters(repo: Repository, branch: str = "main") -> bytes:
    return ipc(read_dead_letters(repo, branch).to_pandas())


def late_per_epoch(repo: Repository, epochs: int) -> list[int]:
    """Dead letters ``late`` per epoch 1..epochs."""
    dead = read_dead_letters(repo, "main").to_pandas()
    late = dead[dead["reason"] == "late"]
    return late.groupby("_epoch").size().reindex(range(1, epochs + 1), fill_value=0).tolist()


def replay_rolled_back_and_forked(spark: Any, job: Job, repo: Repository) -> None:
    """Roll the branch main of a finished run back to its epoch 3 and fork ``fork`` from its
    epoch 2 (both commits carry the epoch's event-time document), then run both to the end,
    at parallelism 2 and 3."""
    from runners.engine.state_ops import new_branch_commit

    before = chain(repo)
    ids = {m.epoch: sid for sid, m in repo.log("heads/main", first_parent=True)}
    head = repo.resolve("main")
    new_branch_commit(repo, ids[3], "main", kind="rollback", operation_id="op-rb",
                      provenance={"reason": "test"}, expected_head=head)  # fmt: skip
    rolled = repo.read_manifest(repo.resolve("main"))
    assert rolled.extra["event_time"] == before[2].extra["event_time"]
    new_branch_commit(repo, ids[2], "fork", kind="fork", operation_id="op-fork",
                      provenance={"reason": "test"})  # fmt: skip
    EpochRunner(spark, job, repo=repo, parallelism=2).run()
    EpochRunner(spark, job, repo=repo, branch="fork", parallelism=3).run()


def killed_and_restarted(tmp_path: Path, data: str, job: str, epoch: int) -> Repository:
    """The job's store after its driver was SIGKILLed half a second into epoch `epoch` (the
    epochs slowed so that it lands inside) and a restart at parallelism 3 ran to the end."""
    store = f"file://{tmp_path}/store"
    run = run_job(store=store, namespace="crash", data=data, job=job,
                  slow_s=0.3, kill_after_epoch_start=(epoch, 0.5))  # fmt: skip
    assert run.killed and run.interrupted_epoch == epoch, run.events
    final = run_job(store=store, namespace="crash", data=data, job=job, parallelism=3)
    assert final.returncode == 0, final.events
    return Repository.open(store, "crash")
