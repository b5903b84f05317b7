"""Aligned mode (docs/webs.md): unaligned -> catching_up -> ready -> aligned and
abort, driven through the downstream's control document, on real Spark runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runners.engine import EpochRunner, read_output
from runners.engine.alignment import AlignmentError, alignment_status, send_command
from runners.engine.branch_source import BranchOutputSource, epoch_mapping
from snapshots_store import Repository
from tests.engine.jobs import aggregate_job
from tests.engine.test_branch_source import _by_epoch, _rows, downstream_job

pytestmark = pytest.mark.spark


def _status(repo: Repository, source: BranchOutputSource) -> Any:
    return alignment_status(repo, "main", source, repo.read_control("main")[0])


def test_catch_up_ready_align_and_abort(spark: Any, tmp_path: Path, epochs_dir: str) -> None:
    url = f"file://{tmp_path}/store"
    up, down = Repository.open(url, "up"), Repository.open(url, "down")
    upstream = EpochRunner(spark, aggregate_job(epochs_dir), repo=up, parallelism=2)
    upstream.run(max_epochs=2)
    source = BranchOutputSource(url, "up", "main", max_epochs_per_epoch=1)
    downstream = EpochRunner(spark, downstream_job(source), repo=down, parallelism=2)
    assert _status(down, source).state == "unaligned" and _status(down, source).lag == 2
    with pytest.raises(AlignmentError, match="only when ready"):
        send_command(down, "main", source, "align")
    send_command(down, "main", source, "catch_up")
    with pytest.raises(AlignmentError, match="only when unaligned"):
        send_command(down, "main", source, "catch_up")
    assert _status(down, source).state == "catching_up"
    downstream.run(max_epochs=1)  # read upstream epoch 1 of 2: past the second-last
    status = _status(down, source)
    assert status.state == "ready" and status.lag == 1
    send_command(down, "main", source, "align")  # from downstream epoch 1 + 2 = 3
    status = _status(down, source)
    assert status.state == "ready" and status.pending and status.from_epoch == 3
    with pytest.raises(AlignmentError, match="pending"):
        send_command(down, "main", source, "align")
    # the upstream runs ahead; downstream epochs 2 (unaligned, bounded to 1 here) then 3..
    upstream.run(max_epochs=3)
    unbounded = BranchOutputSource(url, "up", "main")  # aligned mode bounds it to one epoch
    downstream = EpochRunner(spark, downstream_job(unbounded), repo=down, parallelism=2)
    downstream.run(max_epochs=1)
    assert [m.upstream_epochs for m in epoch_mapping(down, "main")][-1] == (2, 3, 4, 5)
    upstream.run()  # epoch 6
    results = downstream.run()
    assert [r.epoch for r in results] == [3]
    mapping = epoch_mapping(down, "main")
    assert mapping[-1].upstream_epochs == (6,) and mapping[-1].aligned
    assert _status(down, source).state == "aligned"
    # aligned: downstream epoch m holds exactly upstream epoch mapping(m)'s records
    up_out, down_out = _by_epoch(read_output(up, "main")), _by_epoch(read_output(down, "main"))
    assert down_out[3] == up_out[6]
    assert _rows(read_output(down, "main")) == _rows(read_output(up, "main"))
    send_command(down, "main", unbounded, "abort")
    assert _status(down, unbounded).state == "unaligned"


def test_aligned_reads_one_upstream_epoch_per_epoch_and_abort_keeps_the_records(
    spark: Any, tmp_path: Path, epochs_dir: str
) -> None:
    url = f"file://{tmp_path}/store"
    up, down = Repository.open(url, "up"), Repository.open(url, "down")
    EpochRunner(spark, aggregate_job(epochs_dir), repo=up, parallelism=2).run(max_epochs=5)
    source = BranchOutputSource(url, "up", "main")
    down.write_control("main", {"alignment": {"command": "align", "from_epoch": 1}}, None)
    downstream = EpochRunner(spark, downstream_job(source), repo=down, parallelism=2)
    assert [r.epoch for r in downstream.run(max_epochs=3)] == [1, 2, 3]
    assert [m.upstream_epochs for m in epoch_mapping(down, "main")] == [(1,), (2,), (3,)]
    assert _by_epoch(read_output(down, "main")) == {
        e: r for e, r in _by_epoch(read_output(up, "main")).items() if e <= 3
    }
    control, version = down.read_control("main")
    down.write_control("main", {**control, "alignment": {"command": "abort"}}, version)
    assert [r.epoch for r in downstream.run()] == [4]  # unaligned: the rest in one epoch
    assert epoch_mapping(down, "main")[-1].upstream_epochs == (4, 5)
    assert _rows(read_output(down, "main")) == _rows(read_output(up, "main"))


def test_two_aligned_jobs_record_identical_mappings_and_rescaling_keeps_the_inputs(
    spark: Any, tmp_path: Path, epochs_dir: str
) -> None:
    """§4.6: two jobs aligned to one upstream record the same upstream epoch (and snapshot)
    for corresponding epochs; §4.20: rescaling a consumer changes no per-epoch input set."""
    url = f"file://{tmp_path}/store"
    up = Repository.open(url, "up")
    EpochRunner(spark, aggregate_job(epochs_dir), repo=up, parallelism=2).run(max_epochs=4)
    align = {"alignment": {"command": "align", "from_epoch": 1}}
    repos = [Repository.open(url, name) for name in ("a", "b")]
    for repo in repos:
        repo.write_control("main", align, None)
    source = BranchOutputSource(url, "up", "main")
    a = EpochRunner(spark, downstream_job(source), repo=repos[0], parallelism=2)
    assert len(a.run()) == 4
    b = EpochRunner(spark, downstream_job(source), repo=repos[1], parallelism=1)
    b.run(max_epochs=2)
    b = EpochRunner(spark, downstream_job(source), repo=repos[1], parallelism=3)  # rescaled
    b.run()
    ma, mb = epoch_mapping(repos[0], "main"), epoch_mapping(repos[1], "main")
    assert [(m.epoch, m.upstream_snapshots) for m in ma] == [
        (m.epoch, m.upstream_snapshots) for m in mb
    ]
    assert {repos[1].read_manifest(s).parallelism for s in repos[1].ancestors("main")} == {1, 3}
    assert _by_epoch(read_output(repos[0], "main")) == _by_epoch(read_output(repos[1], "main"))
