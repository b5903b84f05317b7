"""Processes racing to move one ref by CAS: one winner per round, no lost update,
a complete ordered reflog — on the local backend (flock) and on S3 (conditional writes)."""

from __future__ import annotations

import itertools
import multiprocessing
from collections import defaultdict
from collections.abc import Sequence

import pytest

from snapshots_store import Repository, check_repository

from . import workers
from .helpers import manifest

WORKERS = 4


def _spawn() -> multiprocessing.context.SpawnContext:
    return multiprocessing.get_context("spawn")


def _run(targets: Sequence[multiprocessing.process.BaseProcess], timeout: float) -> None:
    for process in targets:
        process.start()
    for process in targets:
        process.join(timeout)
    for process in targets:
        if process.is_alive():
            process.kill()
            pytest.fail("a worker process hung")
        assert process.exitcode == 0, f"worker exited with {process.exitcode}"


def _scale(url: str, local: int, s3: int) -> int:
    """Fewer rounds over HTTP, where every round costs dozens of requests."""
    return s3 if url.startswith("s3://") else local


def test_racing_writers_exactly_one_wins_each_round(any_url: str) -> None:
    rounds = _scale(any_url, local=30, s3=15)
    repo = Repository.open(any_url, "app")
    root = repo.commit(manifest(), "main", expected_head=None, reason="root")
    ctx = _spawn()
    barrier = ctx.Barrier(WORKERS)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=workers.race_rounds, args=(any_url, w, rounds, barrier, results))
        for w in range(WORKERS)
    ]
    _run(procs, timeout=120)
    by_round: dict[int, list[tuple[int, str, str | None]]] = defaultdict(list)
    for _ in range(WORKERS * rounds):
        rnd, worker, base, new = results.get(timeout=10)
        by_round[rnd].append((worker, base, new))
    winners: list[str] = []
    expected_base = root
    for rnd in range(rounds):
        attempts = by_round[rnd]
        assert len(attempts) == WORKERS
        assert {base for _, base, _ in attempts} == {expected_base}
        won = [new for _, _, new in attempts if new is not None]
        assert len(won) == 1, f"round {rnd}: {len(won)} winners"
        winners.append(won[0])
        expected_base = won[0]
    assert repo.read_ref("heads/main").target == winners[-1]  # type: ignore[union-attr]
    log = repo.reflog("heads/main")
    assert [e.seq for e in log] == list(range(1, rounds + 2))
    assert [e.new for e in log] == [root, *winners]
    assert [e.old for e in log] == [None, root, *winners[:-1]]
    assert [s for s, _ in repo.log("main", first_parent=True)] == [*winners[::-1], root]


def test_retrying_writers_lose_no_update(any_url: str) -> None:
    count = _scale(any_url, local=10, s3=4)
    ctx = _spawn()
    results = ctx.Queue()
    procs = [
        ctx.Process(target=workers.retry_commits, args=(any_url, w, count, results))
        for w in range(WORKERS)
    ]
    _run(procs, timeout=120)
    repo = Repository.open(any_url, "app")
    committed: set[str] = set()
    for _ in range(WORKERS):
        _, mine, _ = results.get(timeout=10)
        assert len(mine) == count
        committed.update(mine)
    chain = [s for s, _ in repo.log("main", first_parent=True)]
    assert len(chain) == WORKERS * count
    assert set(chain) == committed
    log = repo.reflog("heads/main")
    assert [e.seq for e in log] == list(range(1, WORKERS * count + 1))
    assert [e.new for e in log] == chain[::-1]
    assert all(later.old == earlier.new for earlier, later in itertools.pairwise(log))
    assert check_repository(repo).ok
