"""CLI smoke tests: `python -m snapshots_store` as a user runs it (subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from snapshots_store import Repository
from snapshots_store.objects import object_key

from .helpers import commit_chain

ROOT = Path(__file__).resolve().parents[2]


def run(store_url: str, *args: str, namespace: str = "app") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "snapshots_store",
            "--store",
            store_url,
            "--namespace",
            namespace,
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def history(repo: Repository) -> list[str]:
    ids = commit_chain(repo, 4)
    repo.cas_ref("tags/v1", None, ids[1], reason="savepoint")
    return ids


def test_log_show_diff_refs_reflog_resolve(store_url: str, history: list[str]) -> None:
    out = run(store_url, "log")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [s[:12] for s in history[::-1]]
    assert "(heads/main)" in lines[0] and "(tags/v1)" in lines[2]

    out = run(store_url, "log", "--first-parent", "-n", "2", "v1")
    assert [line.split()[0] for line in out.stdout.splitlines()] == [
        history[1][:12],
        history[0][:12],
    ]

    out = run(store_url, "show", "main")
    assert out.returncode == 0
    assert f"snapshot     {history[3]}" in out.stdout
    assert f"parent       {history[2]}" in out.stdout

    out = run(store_url, "diff", "v1", "main")
    assert out.returncode == 0
    assert "key groups: 1 added, 0 changed, 1 removed" in out.stdout
    assert "src/0  10 -> 30  (+20)" in out.stdout

    out = run(store_url, "refs")
    assert out.stdout.split() == [
        "heads/main",
        history[3],
        "(moved",
        "4x)",
        "tags/v1",
        history[1],
        "(moved",
        "1x)",
    ]

    out = run(store_url, "reflog", "main")
    assert len(out.stdout.splitlines()) == 4 and "epoch 3" in out.stdout
    assert "savepoint" in run(store_url, "reflog", "v1").stdout
    out = run(store_url, "reflog", "heads/main", "-n", "1")
    assert len(out.stdout.splitlines()) == 1 and "epoch 3" in out.stdout

    out = run(store_url, "resolve", history[2][:10])
    assert out.stdout.strip() == history[2]


def test_json_output(store_url: str, history: list[str]) -> None:
    log = json.loads(run(store_url, "--json", "log").stdout)
    assert [entry["id"] for entry in log] == history[::-1]
    assert log[0]["parents"] == [history[2]]
    diff = json.loads(run(store_url, "--json", "diff", "main~1", "main").stdout)
    assert diff["old"] == history[2] and diff["new"] == history[3]
    assert diff["offsets"] == [
        {"source": "src", "partition": "0", "old": 20, "new": 30, "advanced": 10}
    ]
    refs = json.loads(run(store_url, "--json", "refs", "tags/").stdout)
    assert refs == {"tags/v1": {"target": history[1], "seq": 1}}
    reflog = json.loads(run(store_url, "--json", "reflog", "heads/main").stdout)
    assert [e["new"] for e in reflog] == history
    fsck = json.loads(run(store_url, "--json", "fsck").stdout)
    assert fsck["ok"] is True and fsck["snapshots_checked"] == 4


def test_gc_dry_run_then_gc(store_url: str, repo: Repository, history: list[str]) -> None:
    junk = repo.put_object("blob", b"x" * 5000)
    out = run(store_url, "--json", "gc", "--dry-run", "--grace", "1h", "--retention", "0")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["dry_run"] is True
    assert report["removed"] == [] and report["kept_young"] == 1  # younger than the grace
    import time

    time.sleep(1.1)
    out = run(store_url, "gc", "--dry-run", "--grace", "0s", "--retention", "0")
    assert f"would remove  {junk}" in out.stdout
    assert repo.has_object(junk)
    out = run(store_url, "gc", "--grace", "0", "--retention", "1d")
    assert out.returncode == 0 and f"removed  {junk}" in out.stdout
    assert not repo.has_object(junk)


def test_fsck_reports_problems_with_exit_status_3(
    store_url: str, repo: Repository, history: list[str]
) -> None:
    assert run(store_url, "fsck").returncode == 0
    chunk = next(iter(repo.read_manifest(history[2]).key_groups.values()))[0]
    repo.backend.delete(object_key(chunk))
    out = run(store_url, "fsck")
    assert out.returncode == 3
    assert f"missing-object: snapshot {history[2]}: key group 2 chunk {chunk} is missing" in (
        out.stdout
    )


def test_errors_exit_non_zero_with_a_clear_message(store_url: str, history: list[str]) -> None:
    out = run(store_url, "show", "nope")
    assert out.returncode == 1
    assert out.stderr.startswith("error: unknown revision 'nope'")
    assert out.stdout == ""
    out = run(store_url, "reflog", "heads/../x")
    assert out.returncode == 1 and "must not contain '..'" in out.stderr
    out = run(store_url, "log", namespace="../x")
    assert out.returncode == 1 and "invalid name" in out.stderr
    out = run("ftp://nowhere", "log")
    assert out.returncode == 1 and "unsupported scheme" in out.stderr
    out = run(store_url, "gc", "--grace", "soon")
    assert out.returncode == 2 and "not a duration" in out.stderr
    out = run(store_url, "log", "-n", "-1")
    assert out.returncode == 2 and "not a count" in out.stderr
    out = run(store_url, "frobnicate")
    assert out.returncode == 2


def test_store_url_from_environment(store_url: str, history: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "snapshots_store", "--namespace", "app", "resolve", "main"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"STORE_URL": store_url, "PATH": "/usr/bin:/bin"},
    )
    assert out.stdout.strip() == history[-1], out.stderr


def test_log_prints_every_time_in_one_format(repo: Repository, store_url: str) -> None:
    """Manifests keep `created_at` as their writer wrote it (the hash covers it): the engine
    writes `…Z`, older operation commits `+00:00`; the commands print all of them as `…Z`."""
    from snapshots_store import Manifest

    first = repo.commit(
        Manifest(branch="main", epoch=1, max_parallelism=8, parallelism=2, kind="epoch",
                 created_at="2026-01-02T03:04:05.000006+00:00"),
        "main", expected_head=None, reason="an operation's commit",
    )  # fmt: skip
    repo.commit(
        Manifest(branch="main", epoch=2, max_parallelism=8, parallelism=2, kind="epoch",
                 parents=(first,),
                 created_at="2026-01-02T03:04:06.000007Z"),
        "main", expected_head=first, reason="an epoch",
    )  # fmt: skip
    out = run(store_url, "log")
    assert out.returncode == 0, out.stderr
    times = [line.split()[4] for line in out.stdout.splitlines()]
    assert times == ["2026-01-02T03:04:06.000007Z", "2026-01-02T03:04:05.000006Z"]
    assert "+00:00" not in run(store_url, "show", first[:12]).stdout
    assert "+00:00" not in run(store_url, "reflog", "heads/main").stdout
