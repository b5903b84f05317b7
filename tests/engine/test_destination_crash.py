"""Crash and outage tests of the Delta Lake and PostgreSQL sinks against the real things.

The job entry point (with its sinks from ``--sinks``, as the control plane's job spec gives
them) is SIGKILLed between the snapshot's CAS and the sinks' commits, inside Delta's commit
(after its log entry, before the runner knows), inside PostgreSQL's transaction (rows copied,
COMMIT not sent) and inside an epoch; it is restarted each time, the last time at another
parallelism. Both destinations then hold exactly the output of a failure-free run, every
epoch once. A destination that is down (PostgreSQL: an instance of the test's own, stopped;
Delta: its log directory made unwritable) does not stop the job: it goes on committing
snapshots, the sink lag grows, and the sink catches up in order when the destination returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runners.engine import EpochRunner
from runners.engine.destinations import build
from snapshots_store import Repository
from tests.engine.crash_harness import random_kills as kill_times
from tests.engine.crash_harness import run_job
from tests.engine.destination_checks import (
    chain_output,
    database_url,
    delta_rows,
    latest_per_key,
    postgres_rows,
    unique_table,
)
from tests.engine.jobs import aggregate_job, write_epochs

pytestmark = [pytest.mark.spark, pytest.mark.services]


def test_sigkill_around_the_sink_commits_then_restart_equals_failure_free_run(
    spark: Any, tmp_path: Path, sink_tables: list[str]
) -> None:
    # one kill per named point (CAS/commit, inside a destination's commit, inside an epoch)
    # and a restart at another parallelism: four job processes
    _scenario(spark, tmp_path, sink_tables, delta_commit_kill=False, random_kills=0)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [31, 32])
def test_sigkill_sweep_long(spark: Any, tmp_path: Path, sink_tables: list[str], seed: int) -> None:
    _scenario(spark, tmp_path, sink_tables, delta_commit_kill=True, random_kills=3, seed=seed)


def _scenario(
    spark: Any,
    tmp_path: Path,
    sink_tables: list[str],
    *,
    delta_commit_kill: bool,
    random_kills: int,
    seed: int = 31,
) -> None:
    data = tmp_path / "data"
    files = 6 + 2 * random_kills
    write_epochs(str(data), files=files, keys=60, records=400)
    table, latest = unique_table("crash_rows"), unique_table("crash_latest")
    sink_tables += [table, latest]
    sinks = [
        {"name": "rows", "kind": "postgres", "config": {"url": database_url(), "table": table}},
        {"name": "lake", "kind": "delta", "config": {"path": str(tmp_path / "lake")}},
        {
            "name": "latest",
            "kind": "postgres",
            "config": {"url": database_url(), "table": latest, "mode": "upsert"},
        },
    ]
    store = f"file://{tmp_path}/store"
    repo = Repository.open(store, "crash")

    def run(**kw: Any) -> Any:
        return run_job(
            store=store,
            namespace="crash",
            data=str(data),
            max_epochs=None,
            args=["--sinks", json.dumps(sinks)],
            **kw,
        )

    def marks(name: str) -> int:
        import psycopg

        with psycopg.connect(database_url()) as conn:
            row = conn.execute(
                "SELECT max(epoch) FROM epochal_sink_epochs WHERE destination = %s", (name,)
            ).fetchone()
        return int(row[0] or 0) if row else 0

    def lake_epochs() -> set[int]:
        return set(delta_rows(str(tmp_path / "lake"))["_epoch"])

    # between the snapshot's CAS and the sinks' commits: epoch 2 is on the branch only
    killed = run(crash_at="after_cas:2")
    assert killed.killed and killed.head_epoch == 2, killed.events
    assert (marks(table), lake_epochs()) == (1, {1})
    # inside PostgreSQL's transaction of epoch 3 (rows copied, no COMMIT): the restart
    # finished epoch 2 everywhere first
    killed = run(crash_at="in_sink_transaction:3")
    assert killed.killed and killed.head_epoch == 3, killed.events
    assert (marks(table), marks(latest), lake_epochs()) == (2, 2, {1, 2})
    # inside Delta's commit of epoch 4: its log entry written, the runner killed before it
    # returned (PostgreSQL's first table holds epoch 4, the second not yet)
    if delta_commit_kill:
        killed = run(crash_at="mid_sink_commit:4")
        assert killed.killed and killed.head_epoch == 4, killed.events
        assert (marks(table), marks(latest), lake_epochs()) == (4, 3, {1, 2, 3, 4})
    # inside an epoch, before its CAS: nothing of epoch 5 reaches a destination
    killed = run(crash_at="after_outputs:5")
    assert killed.killed and killed.interrupted_epoch == 5, killed.events
    assert (marks(table), marks(latest), lake_epochs()) == (4, 4, {1, 2, 3, 4})
    for n, delay in kill_times(random_kills, seed=seed):  # at random moments inside an epoch
        killed = run(kill_after_epoch_start=(n, delay), slow_s=0.5)
        assert killed.killed, killed.events
    final = run(parallelism=3)
    assert final.returncode == 0 and final.head_epoch == files, final.events

    expected = chain_output(repo)
    assert sorted(set(expected["_epoch"])) == list(range(1, files + 1))
    assert delta_rows(str(tmp_path / "lake")).equals(expected)
    assert postgres_rows(table).equals(expected)
    assert postgres_rows(latest).equals(latest_per_key(expected))
    # ... and the output of a failure-free run over the same files
    reference = Repository.open(f"file://{tmp_path}/reference", "crash")
    EpochRunner(spark, aggregate_job(str(data)), repo=reference, parallelism=2).run()
    assert expected.equals(chain_output(reference))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_server_user(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: then its tools run as the `postgres` user."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@dataclasses.dataclass
class PrivatePostgres:
    """A PostgreSQL server of the test's own (initdb on a free port), stopped and started by
    the test; never the shared one."""

    directory: Path
    port: int

    def _ctl(self, *args: str) -> None:
        cmd = ["pg_ctl", "-D", str(self.directory / "data"), "-w", "-s", *args]
        subprocess.run(_as_server_user(cmd), check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -F"
        self._ctl("-o", options, "-l", str(self.directory / "log"), "start")

    def stop(self) -> None:
        self._ctl("-m", "immediate", "stop")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    import tempfile

    from tests.conftest import require_service

    require_service("initdb and pg_ctl", shutil.which("initdb") is not None, "install PostgreSQL")
    directory = Path(tempfile.mkdtemp(prefix="epochal-pg-"))  # reachable by `postgres`
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres", "postgres")
    cmd = ["initdb", "-D", str(directory / "data"), "-A", "trust", "-U", "postgres", "--no-sync"]
    subprocess.run(_as_server_user(cmd), check=True, capture_output=True, timeout=120)
    server = PrivatePostgres(directory, _free_port())
    server.start()
    yield server
    with contextlib.suppress(Exception):
        server.stop()
    shutil.rmtree(directory, ignore_errors=True)


def unwritable(directory: Path) -> Callable[[], None]:
    """Make `directory` refuse new files, even to root (chmod does not stop root: then the
    immutable attribute); the function undoing it."""
    probe = directory / ".probe"

    def refused() -> bool:
        try:
            probe.touch()
        except OSError:
            return True
        probe.unlink()
        return False

    mode = directory.stat().st_mode
    directory.chmod(0o555)
    if refused():
        return lambda: directory.chmod(mode)
    directory.chmod(mode)
    subprocess.run(["chattr", "+i", str(directory)], check=False, capture_output=True)
    if refused():
        return lambda: subprocess.run(["chattr", "-i", str(directory)], check=True)
    pytest.fail(f"cannot make {directory} unwritable here (neither chmod nor chattr +i)")


def test_destinations_down_for_a_while_the_job_commits_and_the_sinks_catch_up(
    spark: Any, tmp_path: Path, private_postgres: PrivatePostgres
) -> None:
    data = tmp_path / "data"
    write_epochs(str(data), files=5, keys=30, records=200)
    lake = build("lake", "delta", {"path": str(tmp_path / "lake")})
    rows = build("rows", "postgres", {"url": private_postgres.url, "table": "clicks"})
    job = dataclasses.replace(aggregate_job(str(data)), sinks=[lake, rows])
    repo = Repository.open(f"file://{tmp_path}/store", "outage")
    runner = EpochRunner(spark, job, repo=repo, parallelism=2)
    assert runner.run_epoch() is not None
    runner.follower.settle()  # epoch 1's writes (they overlap the next epoch's tasks)
    restore = unwritable(tmp_path / "lake" / "_delta_log")
    private_postgres.stop()
    try:
        for _ in range(3):  # the destinations are down: the job goes on committing
            assert runner.run_epoch() is not None
            time.sleep(0.2)
    finally:
        restore()
    head = repo.read_manifest(repo.resolve("main"))
    assert head.epoch == 4
    assert head.stats["sink_lag_epochs"] == 2  # epochs 2 and 3 missing when 4 committed
    assert head.stats["sink_lag_s"] > 0.2
    assert set(delta_rows(lake.path)["_epoch"]) == {1}
    private_postgres.start()
    runner.follower.follow(repo.resolve("main"), force=True)  # the retry after the outage
    assert not runner.follower.behind()
    assert runner.run_epoch() is not None  # epoch 5, written after 2, 3 and 4
    runner.follower.settle()
    assert runner.follower.lag_stats()["sink_lag_epochs"] == 0
    expected = chain_output(repo)
    assert sorted(set(expected["_epoch"])) == [1, 2, 3, 4, 5]
    assert delta_rows(lake.path).equals(expected)
    rows.close()
    import psycopg

    with psycopg.connect(private_postgres.url) as conn:
        cur = conn.execute("SELECT * FROM clicks")
        names = [d.name for d in cur.description or ()]
        found = cur.fetchall()
    import pandas as pd

    from tests.engine.destination_checks import frame

    assert frame(pd.DataFrame(found, columns=names)).equals(expected)
