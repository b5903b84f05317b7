"""Code run in child processes (multiprocessing spawn / subprocess) by the store tests."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from snapshots_store import Manifest, RefConflictError, Repository

from .helpers import manifest


def _next_manifest(repo: Repository, head: str | None, tag: str) -> Manifest:
    chunk = repo.put_object("chunk", tag.encode())
    epoch = 0 if head is None else repo.read_manifest(head).epoch + 1
    return manifest(epoch=epoch, parents=(head,) if head else (), key_groups={0: [chunk]})


def race_rounds(url: str, worker: int, rounds: int, barrier: Any, results: Any) -> None:
    """Each round every worker tries to move heads/main from the round's head; report wins."""
    repo = Repository.open(url, "app")
    for rnd in range(rounds):
        head = repo.read_ref("heads/main")  # every worker reads the same head: see below
        assert head is not None
        m = _next_manifest(repo, head.target, f"round {rnd} worker {worker}")
        barrier.wait()  # all have read the head and prepared; now race for the CAS
        try:
            new = repo.commit(
                m, "main", expected_head=head.target, operation_id=f"w{worker}", reason=f"r{rnd}"
            )
            results.put((rnd, worker, head.target, new))
        except RefConflictError:
            results.put((rnd, worker, head.target, None))
        barrier.wait()  # everyone has tried before anyone reads the next round's head


def retry_commits(url: str, worker: int, count: int, results: Any) -> None:
    """Commit `count` times on heads/main, re-reading the head after each conflict."""
    repo = Repository.open(url, "app")
    mine: list[str] = []
    conflicts = 0
    while len(mine) < count:
        head = repo.read_ref("heads/main")
        target = None if head is None else head.target
        m = _next_manifest(repo, target, f"worker {worker} commit {len(mine)}")
        try:
            mine.append(repo.commit(m, "main", expected_head=target, reason=f"w{worker}"))
        except RefConflictError:
            conflicts += 1
    results.put((worker, mine, conflicts))


def commit_forever(url: str, size: int) -> None:
    """Commit epochs with incompressible chunks until killed; print each committed id."""
    repo = Repository.open(url, "app")
    head = repo.read_ref("heads/main")
    target = None if head is None else head.target
    while True:
        epoch = 0 if target is None else repo.read_manifest(target).epoch + 1
        chunks = [repo.put_object("chunk", os.urandom(size)) for _ in range(3)]
        m = manifest(
            epoch=epoch,
            parents=(target,) if target else (),
            key_groups={i: [c] for i, c in enumerate(chunks)},
        ).with_changes(outputs=(repo.put_object("output", os.urandom(size // 4)),))
        target = repo.commit(m, "main", expected_head=target, reason=f"epoch {epoch}")
        print(target, flush=True)


def commit_packs_forever(url: str, size: int) -> None:
    """Commit epochs whose key-group chunks are packs (two per epoch: 4 key groups, packs of
    at most 2 chunks), each key group's chain growing by a delta until it has 3 chunks; print
    each committed id."""
    repo = Repository.open(url, "app")
    head = repo.read_ref("heads/main")
    target = None if head is None else head.target
    while True:
        parent = None if target is None else repo.read_manifest(target)
        epoch = 0 if parent is None else parent.epoch + 1
        refs = repo.put_chunks({kg: os.urandom(size) for kg in range(4)}, pack_bytes=2 * size)
        chains = {
            kg: [*(parent.key_groups[kg] if parent and len(parent.key_groups[kg]) < 3 else ()), r]
            for kg, r in refs.items()
        }
        m = manifest(epoch=epoch, parents=(target,) if target else (), key_groups=chains)
        target = repo.commit(m, "main", expected_head=target, reason=f"epoch {epoch}")
        print(target, flush=True)


def die_before_cas(url: str) -> None:
    """Write a commit's objects and manifest, then SIGKILL itself before the ref CAS."""
    repo = Repository.open(url, "app")
    head = repo.read_ref("heads/main")
    assert head is not None
    m = _next_manifest(repo, head.target, "doomed commit")
    sid = repo.write_manifest(m)
    print(sid, *m.key_groups[0], flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "commit-forever":
        commit_forever(args[0], int(args[1]))
    elif command == "commit-packs-forever":
        commit_packs_forever(args[0], int(args[1]))
    elif command == "die-before-cas":
        die_before_cas(args[0])
    else:
        raise SystemExit(f"unknown command {command}")
