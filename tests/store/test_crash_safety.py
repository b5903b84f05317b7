"""A writer SIGKILLed anywhere never leaves a ref pointing at a missing or partial object;
gc (grace 0) then removes the debris and nothing reachable; fsck is clean."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from snapshots_store import GcReport, Repository, check_repository, collect_garbage
from snapshots_store.objects import id_from_key
from snapshots_store.packs import ref_objects

from .helpers import commit_chain

ROOT = Path(__file__).resolve().parents[2]
TEMP_KEY = "objects/ab/.cdef.tmp-0123456789abcdef"


def _writer(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.store.workers", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def _first_commit(writer: subprocess.Popen[str]) -> str:
    """Block until the writer has committed once (so every kill lands in a running loop)."""
    assert writer.stdout is not None
    line = writer.stdout.readline().strip()
    assert line, f"the writer exited before its first commit (status {writer.poll()})"
    return line


def _assert_head_is_sound(repo: Repository) -> None:
    head = repo.read_ref("heads/main")
    if head is None:
        return
    manifest = repo.read_manifest(head.target)  # verified: hash, schema
    for chunks in manifest.key_groups.values():
        repo.read_chunks(chunks)  # loose chunks or pack members, verified
    for output in manifest.outputs:
        repo.get_object(output)


def _collect_and_check(repo: Repository) -> GcReport:
    time.sleep(1.1)  # older than the grace period, given one-second mtime resolution
    report = collect_garbage(repo, retention=timedelta(0), grace=timedelta(0), dry_run=False)
    assert check_repository(repo).ok, check_repository(repo).problems
    head = repo.read_ref("heads/main")
    reachable = set()
    if head is not None:
        for sid, m in repo.log("main"):
            reachable.add(sid)
            reachable.update(ref_objects(c for chunks in m.key_groups.values() for c in chunks))
            reachable.update(m.outputs)
    stored = {id_from_key(info.key) for info in repo.backend.list("objects/")}
    assert stored == reachable
    assert list(repo.backend.list_partial("")) == []
    assert not {item.object_id for item in report.removed} & reachable
    return report


def test_writer_killed_at_random_points_never_breaks_the_head(any_url: str) -> None:
    repo = Repository.open(any_url, "app")
    rng = random.Random(20261123)
    rounds = 5 if any_url.startswith("s3://") else 8
    for _ in range(rounds):
        writer = _writer("commit-forever", any_url, "200000")
        first = _first_commit(writer)
        time.sleep(rng.uniform(0.0, 0.25))  # somewhere inside a later commit
        writer.send_signal(signal.SIGKILL)
        writer.communicate(timeout=30)
        assert writer.returncode == -signal.SIGKILL
        assert repo.is_ancestor(first, "main")
        _assert_head_is_sound(Repository.open(any_url, "app"))
    history = [sid for sid, _ in repo.log("main", first_parent=True)]
    assert len(history) >= rounds  # every writer committed at least once before its kill
    assert [e.new for e in repo.reflog("heads/main")] == history[::-1]
    report = _collect_and_check(repo)
    assert report.removed, "no kill left debris; the kills did not land mid-commit"


def test_writer_of_packs_killed_at_random_points_never_breaks_the_head(any_url: str) -> None:
    """Packs are written whole (temp file, fsync, rename; one S3 PUT) before the manifest
    names them: a kill mid-pack leaves only debris, never a head naming a partial pack.

    A random kill may land between two commits (nothing in flight), more often on a loaded
    machine: the test kills until at least two kills provably landed mid-commit (they left
    debris that gc removed), with a floor of rounds and a bound on them."""
    repo = Repository.open(any_url, "app")
    rng = random.Random(20261125)
    least = 4 if any_url.startswith("s3://") else 6
    rounds = landed = 0
    while rounds < least or (landed < 2 and rounds < 30):
        rounds += 1
        writer = _writer("commit-packs-forever", any_url, "300000")
        first = _first_commit(writer)
        time.sleep(rng.uniform(0.0, 0.25))
        writer.send_signal(signal.SIGKILL)
        writer.communicate(timeout=30)
        assert writer.returncode == -signal.SIGKILL
        assert repo.is_ancestor(first, "main")
        _assert_head_is_sound(Repository.open(any_url, "app"))
        landed += bool(_collect_and_check(repo).removed)
    assert landed >= 2, f"only {landed} of {rounds} kills landed mid-commit"
    history = [m for _, m in repo.log("main")]
    assert all(m.format == 2 for m in history)
    assert max(len(c) for m in history for c in m.key_groups.values()) > 1  # across packs


def test_kill_between_object_write_and_ref_cas(any_url: str) -> None:
    repo = Repository.open(any_url, "app")
    ids = commit_chain(repo, 3)
    writer = _writer("die-before-cas", any_url)
    out, _ = writer.communicate(timeout=30)
    assert writer.returncode == -signal.SIGKILL
    doomed_manifest, doomed_chunk = out.split()
    assert repo.has_object(doomed_manifest) and repo.has_object(doomed_chunk)
    assert repo.read_ref("heads/main").target == ids[-1]  # type: ignore[union-attr]
    report = collect_garbage(repo, retention=timedelta(0), grace=timedelta(hours=1), dry_run=False)
    assert report.removed == () and report.kept_young == 2  # in-flight objects are protected
    _collect_and_check(repo)
    assert not repo.has_object(doomed_manifest) and not repo.has_object(doomed_chunk)
    assert [sid for sid, _ in repo.log("main")] == ids[::-1]


def test_leftover_temp_files_are_partial_writes_gc_removes(
    repo: Repository, local_root: Path
) -> None:
    ids = commit_chain(repo, 2)
    debris = local_root / "app" / "objects" / "ab" / ".cdef.tmp-0123456789abcdef"
    debris.parent.mkdir(parents=True, exist_ok=True)
    debris.write_bytes(b"EPO1 chunk 100\n\x28\xb5")  # a killed writer's half-written file
    assert [i.key for i in repo.backend.list_partial("")] == [
        "objects/ab/.cdef.tmp-0123456789abcdef"
    ]
    assert check_repository(repo).ok
    dry = collect_garbage(repo, retention=timedelta(0), grace=timedelta(0), dry_run=True)
    time.sleep(1.1)
    report = collect_garbage(repo, retention=timedelta(0), grace=timedelta(0), dry_run=False)
    assert dry.removed == () or dry.removed[0].reason == "partial write"
    assert [(i.key, i.reason) for i in report.removed] == [(TEMP_KEY, "partial write")]
    assert not debris.exists()
    assert [sid for sid, _ in repo.log("main")] == ids[::-1]
