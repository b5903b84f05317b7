"""The epoch loop end to end on the shared local SparkSession: outputs, rescale, restore, fork,
incremental snapshots, dead letters, control and the per-key path."""

from __future__ import annotations

import os
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from runners.engine import EpochRunner, Job, read_dead_letters, read_output, sources
from runners.engine import aggregations as agg
from runners.engine.keygroups import key_group_of
from runners.engine.sources import write_jsonl_file
from runners.engine.state.restore import load_key_group
from snapshots_store import Repository
from tests.engine.jobs import aggregate_job, reference_output, running_total

pytestmark = pytest.mark.spark


def _frame(table: pa.Table) -> pd.DataFrame:
    return table.to_pandas().sort_values(["_epoch", "key"]).reset_index(drop=True)


def _state(repo: Repository, rev: str, keys: tuple[str, ...] = ("key",)) -> pd.DataFrame:
    """Every key's state at a snapshot; asserts each key sits in its own key group's chunk."""
    manifest = repo.read_manifest(repo.resolve(rev))
    frames = []
    for kg, chain in manifest.key_groups.items():
        table = load_key_group(repo, chain, keys, use_cache=False).table
        assert {
            key_group_of(k, manifest.max_parallelism) for k in table.column("key").to_pylist()
        } <= {kg}
        frames.append(table.to_pandas())
    return pd.concat(frames).sort_values("key").reset_index(drop=True)


@pytest.fixture(scope="module")
def fixed_run(spark: Any, epochs_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Repository:
    """The failure-free run at fixed parallelism 2 that other runs are compared with."""
    root = tmp_path_factory.mktemp("fixed")
    repo = Repository.open(f"file://{root}/store", "fixed")
    results = EpochRunner(spark, aggregate_job(epochs_dir), repo=repo, parallelism=2).run()
    assert [r.epoch for r in results] == [1, 2, 3, 4, 5, 6]
    return repo


def test_aggregate_output_equals_running_aggregates_per_changed_key(
    fixed_run: Repository, epochs_dir: str
) -> None:
    got = _frame(read_output(fixed_run, "main"))
    expected = reference_output(epochs_dir)
    pd.testing.assert_frame_equal(got[expected.columns], expected, check_dtype=False)
    head = fixed_run.read_manifest(fixed_run.resolve("main"))
    assert head.epoch == 6 and head.parallelism == 2 and head.max_parallelism == 128
    assert head.offsets["files"] == {f"part-{i:05d}.parquet": 2000 for i in range(6)}
    assert head.stats["records_in"] == 2000 and head.stats["dead_letters"] == 0
    # what each task did, for the epoch view: they add up to the epoch's totals
    tasks = head.extra["tasks"]
    assert [t["task"] for t in tasks] == [0, 1]
    assert sum(t["records_in"] for t in tasks) == head.stats["records_in"]
    assert sum(t["output_rows"] for t in tasks) == head.stats["output_rows"]
    assert sum(t["bytes_written"] for t in tasks) == head.stats["bytes_written"]
    assert round(sum(t["busy_s"] for t in tasks), 3) == round(head.stats["busy_s"], 3)


def test_second_run_finds_no_new_data(spark: Any, fixed_run: Repository, epochs_dir: str) -> None:
    runner = EpochRunner(spark, aggregate_job(epochs_dir), repo=fixed_run, parallelism=2)
    assert runner.run_epoch() is None
    assert runner.stopped_reason == "no new data"


def test_live_rescale_2_3_1_4_keeps_state_and_output(
    spark: Any, fixed_run: Repository, epochs_dir: str, repo: Repository
) -> None:
    runner = EpochRunner(spark, aggregate_job(epochs_dir), repo=repo, parallelism=2)
    seen = []
    for p in (2, 3, 1, 4, 4, 2):
        _, version = repo.read_control("main")
        repo.write_control("main", {"parallelism": p}, version)
        result = runner.run_epoch()
        assert result is not None and result.parallelism == p
        manifest = repo.read_manifest(result.snapshot_id)
        seen.append(manifest.parallelism)
        # A live rescale moves key groups between tasks without reading them from the store
        # again: a moved key group comes from the machine's state cache (docs/engine.md).
        assert manifest.stats.get("restore_bytes", 0) == 0, (p, manifest.stats)
    assert seen == [2, 3, 1, 4, 4, 2]
    pd.testing.assert_frame_equal(
        _frame(read_output(repo, "main")), _frame(read_output(fixed_run, "main"))
    )
    pd.testing.assert_frame_equal(_state(repo, "main"), _state(fixed_run, "main"))


def test_shuffle_and_scan_routing_give_the_same_snapshots(
    spark: Any, fixed_run: Repository, epochs_dir: str, repo: Repository
) -> None:
    job = aggregate_job(epochs_dir)
    EpochRunner(spark, job, repo=repo, parallelism=2, routing="shuffle").run()
    pd.testing.assert_frame_equal(
        _frame(read_output(repo, "main")), _frame(read_output(fixed_run, "main"))
    )
    mine = repo.read_manifest(repo.resolve("main"))
    theirs = fixed_run.read_manifest(fixed_run.resolve("main"))
    assert mine.key_groups == theirs.key_groups  # byte-identical chunks
    assert mine.outputs == theirs.outputs


def test_rescale_with_restart_keeps_state_and_output(
    spark: Any, fixed_run: Repository, epochs_dir: str, repo: Repository
) -> None:
    for p in (2, 3, 1, 4, 1, 3):  # a new runner (a restarted job) per epoch
        result = EpochRunner(spark, aggregate_job(epochs_dir), repo=repo, parallelism=p).run_epoch()
        assert result is not None and result.parallelism == p
    pd.testing.assert_frame_equal(
        _frame(read_output(repo, "main")), _frame(read_output(fixed_run, "main"))
    )
    pd.testing.assert_frame_equal(_state(repo, "main"), _state(fixed_run, "main"))


def test_restore_snapshot_and_continue_reproduces_later_epochs(
    spark: Any, fixed_run: Repository, epochs_dir: str
) -> None:
    snapshot_2 = fixed_run.resolve("main~4")
    assert fixed_run.read_manifest(snapshot_2).epoch == 2
    runner = EpochRunner(
        spark,
        aggregate_job(epochs_dir),
        repo=fixed_run,
        branch="restored",
        parallelism=3,
        base=snapshot_2,
    )
    assert [r.epoch for r in runner.run()] == [3, 4, 5, 6]
    pd.testing.assert_frame_equal(
        _frame(read_output(fixed_run, "restored")), _frame(read_output(fixed_run, "main"))
    )
    assert fixed_run.read_manifest(fixed_run.resolve("restored~4")).epoch == 2
    pd.testing.assert_frame_equal(_state(fixed_run, "restored"), _state(fixed_run, "main"))


def test_fork_outputs_are_separate_from_origin(
    spark: Any, fixed_run: Repository, epochs_dir: str
) -> None:
    before = _frame(read_output(fixed_run, "main"))
    snapshot_3 = fixed_run.resolve("main~3")
    job = aggregate_job(epochs_dir, aggregate=[agg.count(), agg.sum("value")], code_version="2")
    runner = EpochRunner(
        spark, job, repo=fixed_run, branch="fork-sum", parallelism=1, base=snapshot_3
    )
    results = runner.run(max_epochs=1)
    assert [r.epoch for r in results] == [4]
    fork = _frame(read_output(fixed_run, "fork-sum"))
    pd.testing.assert_frame_equal(_frame(read_output(fixed_run, "main")), before)
    pd.testing.assert_frame_equal(
        fork[fork["_epoch"] <= 3].reset_index(drop=True),
        before[before["_epoch"] <= 3].reset_index(drop=True),
        check_dtype=False,
    )
    fork4 = fork[fork["_epoch"] == 4]
    main4 = before[before["_epoch"] == 4]
    assert list(fork4["key"]) == list(main4["key"])
    assert list(fork4["sum_value"]) == list(main4["sum_value"])
    assert fork4["max_value"].isna().all()  # the fork's code no longer keeps max
    assert fixed_run.read_manifest(results[0].snapshot_id).code_version == "2"


def test_bytes_written_are_proportional_to_changed_key_groups(
    spark: Any, repo: Repository, tmp_path: Any
) -> None:
    from runners.engine.sources import write_parquet_file

    directory = str(tmp_path / "in")
    keys = [f"user-{i}" for i in range(20_000)]
    write_parquet_file(directory, "part-00000", pa.table({"key": keys, "value": [1] * len(keys)}))
    few = [k for k in keys if key_group_of(k, 128) < 4][:200]  # 1% of the keys, 4 key groups
    for i in range(1, 4):
        write_parquet_file(directory, f"part-{i:05d}", pa.table({"key": few, "value": [i] * 200}))
    job = aggregate_job(directory, aggregate=[agg.count(), agg.sum("value")])
    results = EpochRunner(spark, job, repo=repo, parallelism=2).run()
    full, small = results[0], results[1:]
    # deltas grow until they outweigh a key group's base, then it is compacted
    assert sum(r.bytes_written for r in small) <= 2.5 * sum(r.changed_state_bytes for r in small)
    for r in small:
        manifest = repo.read_manifest(r.snapshot_id)
        assert manifest.stats["chunks_written"] == 4
        assert r.bytes_written < 0.05 * full.bytes_written
        diff = repo.diff(f"{r.snapshot_id}~1", r.snapshot_id)
        assert [c.key_group for c in diff.changed] == [0, 1, 2, 3] and not diff.added


def test_dead_letters_are_kept_with_reasons_and_the_epoch_commits(
    spark: Any, repo: Repository, tmp_path: Any
) -> None:
    directory = str(tmp_path / "json")
    write_jsonl_file(
        directory,
        "a",
        [
            {"user": "u1", "value": 5},
            "{not json",
            {"value": 3},
            {"user": "u2", "value": "seven"},
            {"user": "u1", "value": 7},
            "[1, 2]",
        ],
    )
    source = sources.JsonLinesDirectory(directory, schema={"user": "string", "value": "int64"})
    job = Job(name="json", source=source, key="user", aggregate=[agg.count(), agg.sum("value")])
    result = EpochRunner(spark, job, repo=repo, parallelism=2).run_epoch()
    assert result is not None and result.dead_letters == 4 and result.records_in == 6
    assert read_output(repo, "main").select(["user", "count", "sum_value"]).to_pylist() == [
        {"user": "u1", "count": 2, "sum_value": 12}
    ]
    dead = read_dead_letters(repo, "main").to_pylist()
    reasons = sorted(d["reason"] for d in dead)
    assert len(reasons) == 4
    assert any("Expecting" in r or "JSON" in r for r in reasons)
    assert any("missing field 'user'" in r for r in reasons)  # the key
    assert any("field 'value'" in r for r in reasons)
    # each dead letter keeps its line as it was in the file, not a row decoded from it
    lines = (tmp_path / "json" / "a.jsonl").read_text().splitlines()
    assert sorted(d["raw"] for d in dead) == sorted(lines[1:4] + lines[5:6])
    [no_key] = [d for d in dead if "'user'" in d["reason"]]
    assert no_key["raw"] == lines[2] == '{"value": 3}'
    assert any("JSON object" in r for r in reasons)
    manifest = repo.read_manifest(result.snapshot_id)
    assert manifest.stats["dead_letters"] == 4


def test_per_key_function_path_equals_vectorised_aggregate(
    spark: Any, fixed_run: Repository, epochs_dir: str, repo: Repository
) -> None:
    job = aggregate_job(epochs_dir, aggregate=None, process=running_total)
    EpochRunner(spark, job, repo=repo, parallelism=3).run(max_epochs=3)
    got = _frame(read_output(repo, "main"))
    expected = _frame(read_output(fixed_run, "main"))
    expected = expected[expected["_epoch"] <= 3][got.columns].reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


def test_value_state_ttl_expires_in_processing_time(
    spark: Any, repo: Repository, tmp_path: Any
) -> None:
    from runners.engine.sources import write_parquet_file

    directory = str(tmp_path / "in")
    for i in range(4):  # key "a" every epoch, key "b" only in epochs 1 and 4
        keys = ["a", "b"] if i in (0, 3) else ["a"]
        write_parquet_file(directory, f"p{i}", pa.table({"key": keys, "value": [1] * len(keys)}))

    def seen_before(key: Any, records: Any, state: Any, ctx: Any) -> Any:
        last = state.value("last", ttl_ms=2500)
        yield {"key": key, "previous": last.get(), "now": ctx.processing_time_ms}
        last.set(ctx.epoch)

    job = aggregate_job(directory, aggregate=None, process=seen_before)
    EpochRunner(spark, job, repo=repo, parallelism=2).run()
    rows = {(r["key"], r["_epoch"]): r["previous"] for r in read_output(repo, "main").to_pylist()}
    assert rows[("a", 1)] is None and rows[("a", 4)] == 3
    assert rows[("b", 1)] is None and rows[("b", 4)] is None  # set at 1000 ms, expired at 3500


def test_control_pause_and_stop_after_epoch(spark: Any, epochs_dir: str, repo: Repository) -> None:
    runner = EpochRunner(spark, aggregate_job(epochs_dir), repo=repo, parallelism=2)
    version = repo.write_control("main", {"paused": True}, None)
    assert runner.run_epoch() is None and runner.stopped_reason == "paused"
    repo.write_control("main", {"stop_after_epoch": 2, "operation_id": "op-7"}, version)
    assert [r.epoch for r in runner.run()] == [1, 2]
    assert runner.stopped_reason == "stop_after_epoch 2"
    head = repo.read_manifest(repo.resolve("main"))
    assert head.extra["control"] == {
        "parallelism": 2,
        "stop_after_epoch": 2,
        "operation_id": "op-7",
    }


def test_failing_notification_is_ignored(spark: Any, epochs_dir: str, repo: Repository) -> None:
    calls = []

    def broken(result: Any) -> None:
        calls.append(result.epoch)
        raise RuntimeError("control plane down")

    runner = EpochRunner(spark, aggregate_job(epochs_dir), repo=repo, parallelism=2, notify=broken)
    assert runner.run(max_epochs=1)[0].epoch == 1
    url_runner = EpochRunner(
        spark, aggregate_job(epochs_dir), repo=repo, notify="http://127.0.0.1:9/epochs"
    )
    assert url_runner.run(max_epochs=1)[0].epoch == 2
    assert repo.read_manifest(repo.resolve("main")).epoch == 2


def test_context_random_is_deterministic_per_branch_epoch_and_key_group(
    spark: Any, epochs_dir: str, tmp_path: Any
) -> None:
    def draw(key: Any, records: Any, state: Any, ctx: Any) -> Any:
        yield {"key": key, "kg": ctx.key_group, "draw": ctx.random.random()}

    job = aggregate_job(epochs_dir, aggregate=None, process=draw)
    outputs = []
    for i, p in enumerate((1, 3)):
        repo = Repository.open(f"file://{tmp_path}/s{i}", "rnd")
        EpochRunner(spark, job, repo=repo, parallelism=p).run(max_epochs=2)
        outputs.append(read_output(repo, "main").to_pylist())
    assert outputs[0] == outputs[1] and len({r["draw"] for r in outputs[0]}) > 100


def test_generator_source_is_deterministic(spark: Any, repo: Repository) -> None:
    job = Job(
        name="gen",
        source=sources.Generator(keys=50, records_per_epoch=300, seed=5, epochs=2),
        key="key",
        aggregate=[agg.count()],
    )
    results = EpochRunner(spark, job, repo=repo, parallelism=2).run()
    assert [r.records_in for r in results] == [300, 300]
    total = read_output(repo, "main").to_pandas()
    assert total[total["_epoch"] == 2]["count"].sum() >= 300
    assert os.environ.get("EPOCHAL_CRASH_AT") is None


def test_distinct_and_windowed_counts_equal_reference_at_any_parallelism(
    spark: Any, epochs_dir: str, tmp_path: Any
) -> None:
    import pyarrow.parquet as pq

    job = aggregate_job(
        epochs_dir,
        aggregate=[agg.distinct_count("value"), agg.windowed_count("ts", 500), agg.count()],
    )
    frames = []
    for p in (2, 3):  # scan and shuffle routing
        repo = Repository.open(f"file://{tmp_path}/s{p}", "special")
        EpochRunner(spark, job, repo=repo, parallelism=p).run(max_epochs=3)
        frames.append(_frame(read_output(repo, "main")))
    pd.testing.assert_frame_equal(frames[0], frames[1])
    got = frames[0]
    assert list(got.columns) == [
        "key", "distinct_count_value", "windowed_count_ts", "count", "_epoch",
    ]  # fmt: skip
    seen = pd.DataFrame()
    files = sorted(f for f in os.listdir(epochs_dir) if f.endswith(".parquet"))[:3]
    for epoch, name in enumerate(files, start=1):
        df = pq.read_table(os.path.join(epochs_dir, name)).to_pandas()
        seen = pd.concat([seen, df], ignore_index=True)
        mine = got[got["_epoch"] == epoch].set_index("key")
        assert set(mine.index) == set(df["key"])
        for key, rows in seen[seen["key"].isin(set(df["key"]))].groupby("key"):
            latest = rows["ts"].max() // 500 * 500
            assert mine.loc[key, "distinct_count_value"] == rows["value"].nunique()
            assert mine.loc[key, "windowed_count_ts"] == (rows["ts"] // 500 * 500 == latest).sum()
            assert mine.loc[key, "count"] == len(rows)


def test_publish_output_to_sql_is_idempotent_and_follows_rollback(
    fixed_run: Repository, tmp_path: Any
) -> None:
    import sqlite3

    from runners.engine import publish_output

    db = sqlite3.connect(str(tmp_path / "sink.db"))
    total = read_output(fixed_run, "main").num_rows
    assert publish_output(fixed_run, "main", db, "clicks_out") == total
    assert publish_output(fixed_run, "main", db, "clicks_out") == 0  # idempotent
    assert db.execute("SELECT count(*) FROM clicks_out").fetchone()[0] == total
    # roll a copy of the branch back two epochs: its published rows follow
    head = fixed_run.resolve("main")
    fixed_run.cas_ref("heads/rolled", None, head, reason="test")
    publish_output(fixed_run, "rolled", db, "clicks_out")
    fixed_run.cas_ref("heads/rolled", head, fixed_run.resolve("main~2"), reason="rollback")
    publish_output(fixed_run, "rolled", db, "clicks_out")
    epochs = db.execute("SELECT DISTINCT epoch FROM clicks_out WHERE branch='rolled'").fetchall()
    assert sorted(e for (e,) in epochs) == [1, 2, 3, 4]
