"""`.venv/bin/epochal`, run as a user runs it: a subprocess from another directory, configured
only by the environment, against the test's PostgreSQL database and a real store. Operations
that need no Spark run for real (`--inline`); tests/e2e drives one through a Celery worker.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.jobs.models import Job
from controlplane.jobs.store import job_repository
from controlplane.operations.models import Operation
from snapshots_store import Repository
from tests.conftest import require_service
from tests.e2e.harness import database_url
from tests.operations.test_requests import commit_epochs
from tests.operations.test_requests import job as job  # the fixture

ROOT = Path(__file__).resolve().parents[2]
EPOCHAL = ROOT / ".venv" / "bin" / "epochal"
VERBS = [
    "jobs",
    "register",
    "log",
    "start",
    "stop",
    "savepoint",
    "rescale",
    "rollback",
    "fork",
    "migrate",
    "align",
    "hotswap",
    "operation",
    "store",
]

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The shell of a user: no DJANGO_SETTINGS_MODULE, no PYTHONPATH, the test's database."""
    if not EPOCHAL.exists():
        pytest.fail(f"{EPOCHAL} is missing: run bin/setup (it installs the project's commands)")
    from django.db import connection

    require_service(
        "PostgreSQL",
        connection.vendor == "postgresql",
        "the CLI subprocess needs the test database shared: DATABASE_URL=postgres://…",
    )
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("EPOCHAL_", "DJANGO_")) and k not in ("PYTHONPATH", "STORE_URL")
    }
    return {
        **clean,
        "DATABASE_URL": database_url(),
        "EPOCHAL_VAR_DIR": str(tmp_path / "var"),
        "STORE_URL": f"file://{tmp_path / 'store'}",  # where the `job` fixture's store is
        "CELERY_BROKER_URL": "memory://",
    }


def epochal(
    env: dict[str, str], cwd: Path, *args: str, status: int = 0
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(EPOCHAL), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == status, (
        f"epochal {' '.join(args)} exited {proc.returncode}, not {status}:\n"
        f"{proc.stdout}\n{proc.stderr}"
    )
    return proc


def test_help_lists_every_verb_on_one_line_from_any_directory(
    env: dict[str, str], tmp_path: Path
) -> None:
    out = epochal(env, tmp_path, "--help").stdout
    for verb in VERBS:
        assert re.search(rf"^    {verb} +\S.+$", out, re.MULTILINE), (
            f"{verb} not on one line:\n{out}"
        )
    assert "rescale" in epochal(env, tmp_path, "rescale", "--help").stdout


def test_jobs_as_a_table_and_as_json(env: dict[str, str], tmp_path: Path, job: Job) -> None:
    [*_, head] = commit_epochs(job, 2)
    table = epochal(env, tmp_path, "jobs").stdout.splitlines()
    assert table[0].split() == ["JOB", "APPLICATION", "BRANCH", "STATE", "P", "HEAD", "OPERATION"]
    assert table[1].split() == ["clicks-main", "clicks", "main", "created", "2", head[:12]]
    [row] = json.loads(epochal(env, tmp_path, "jobs", "--json").stdout)
    assert row["name"] == "clicks-main" and row["head"] == head and row["operation"] is None


def test_rescale_and_rollback_run_for_real_with_progress_step_by_step(
    env: dict[str, str], tmp_path: Path, job: Job
) -> None:
    ids = commit_epochs(job, 3)
    proc = epochal(env, tmp_path, "rescale", "clicks-main", "-p", "3", "--inline")
    op = Operation.objects.get(kind="rescale")
    assert op.state == "succeeded"
    names = [p["name"] for p in op.phases]
    steps = re.findall(r"^  step (\d+)/(\d+)  (\w+) +(\w+)", proc.stdout, re.MULTILINE)
    finished = [(int(k), name) for k, n, name, state in steps if state == "succeeded"]
    assert finished == list(enumerate(names, start=1)), proc.stdout  # every step, in order
    assert {int(n) for _, n, _, _ in steps} == {len(names)}
    assert proc.stdout.splitlines()[-1].startswith("rescale succeeded")
    head = job_repository(job).read_manifest(job_repository(job).resolve("main"))
    assert head.kind == "rescale" and head.parallelism == 3

    out = epochal(
        env, tmp_path, "rollback", "clicks-main", "--to", ids[1][:12], "--inline", "--json"
    )
    final = json.loads(out.stdout)  # stdout is one JSON document; progress went to stderr
    assert final["kind"] == "rollback" and final["state"] == "succeeded"
    assert "step 1/" in out.stderr
    repo = job_repository(job)
    assert repo.read_manifest(repo.resolve("main")).parents == (ids[1],)

    listed = epochal(env, tmp_path, "operation").stdout.splitlines()
    assert listed[0].split()[:5] == ["ID", "CREATED", "KIND", "TARGET", "STATE"]
    assert [line.split()[3] for line in listed[1:]] == ["rollback", "rescale"]
    shown = epochal(env, tmp_path, "operation", str(op.pk)).stdout
    assert f"rescale operation {op.pk} on job clicks-main" in shown
    assert shown.splitlines()[-1].startswith("rescale succeeded")


def test_bad_input_is_named_with_what_to_do(env: dict[str, str], tmp_path: Path, job: Job) -> None:
    proc = epochal(env, tmp_path, "rescale", "nope", "-p", "3", status=1)
    assert "no job named 'nope'" in proc.stderr and "epochal jobs" in proc.stderr
    proc = epochal(env, tmp_path, "rescale", "clicks-main", status=2)
    assert "--parallelism" in proc.stderr
    commit_epochs(job, 1)
    proc = epochal(env, tmp_path, "rescale", "clicks-main", "-p", "999", "--inline", status=1)
    assert "parallelism" in proc.stderr
    assert not Operation.objects.exists()  # nothing recorded for a refused request
    proc = epochal(env, tmp_path, "store", "--application", "ghost", "log", status=1)
    assert "no application 'ghost'" in proc.stderr


def test_store_verbs_use_the_application_store_by_default(
    env: dict[str, str], tmp_path: Path, job: Job
) -> None:
    ids = commit_epochs(job, 3)
    log = epochal(env, tmp_path, "store", "log").stdout.splitlines()
    assert [line.split()[0] for line in log] == [sid[:12] for sid in reversed(ids)]
    assert json.loads(epochal(env, tmp_path, "store", "fsck", "--json").stdout)["ok"] is True
    assert epochal(env, tmp_path, "store", "resolve", "main~1").stdout.strip() == ids[1]
    # any namespace of a store: the configured STORE_URL unless --store names another
    refs = epochal(env, tmp_path, "store", "--namespace", "clicks", "refs").stdout
    assert refs.split()[:2] == ["heads/main", ids[-1]]
    Repository.open(f"file://{tmp_path / 'elsewhere'}", "clicks")
    other = ["store", "--store", f"file://{tmp_path / 'elsewhere'}", "--namespace", "clicks"]
    assert epochal(env, tmp_path, *other, "refs").stdout.strip() == ""


def test_manage_py_commands_are_the_same_verbs(
    env: dict[str, str], tmp_path: Path, job: Job
) -> None:
    commit_epochs(job, 2)
    direct = epochal(env, tmp_path, "jobs").stdout
    managed = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "jobs"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert managed == direct


def test_python_m_snapshots_store_defaults_to_the_configured_store(
    env: dict[str, str], tmp_path: Path
) -> None:
    python = str(ROOT / ".venv" / "bin" / "python")
    run = dict(cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True)
    out = subprocess.run([python, "-m", "snapshots_store", "--help"], env=env, **run).stdout
    assert env["STORE_URL"] in "".join(out.split())  # argparse wraps long paths at hyphens
    unset = {k: v for k, v in env.items() if k != "STORE_URL"}
    out = subprocess.run([python, "-m", "snapshots_store", "--help"], env=unset, **run).stdout
    assert f"file://{tmp_path / 'var' / 'store'}" in "".join(out.split())
