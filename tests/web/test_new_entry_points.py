"""The web process sees a job package installed while it runs: a job whose entry point was
missing shows its input lag once the package is there, without a restart of the server.

The package is installed the way pip installs one — a module and its `*.dist-info` (with
`entry_points.txt`) written into a directory already on `sys.path` — while this process (the
web server's) keeps running and has already failed to load the job once."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.test import Client

from controlplane.jobs import health
from controlplane.jobs.models import Job
from tests.web.conftest import Lineage

ClientFor = Callable[[str | None], Client]

PACKAGE = "epochal_late_package"


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Path]:
    """An empty site-packages directory on sys.path."""
    site = tmp_path / "site-packages"
    site.mkdir()
    sys.path.append(str(site))
    try:
        yield site
    finally:
        sys.path.remove(str(site))
        sys.modules.pop(PACKAGE, None)


def install(site: Path) -> None:
    (site / f"{PACKAGE}.py").write_text(
        "from runners.jobs import clickstream\n\n\n"
        "def job(directory: str = ''):\n"
        "    return clickstream.job(directory=directory)\n"
    )
    info = site / f"{PACKAGE}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[epochal.jobs]\nlate-job = {PACKAGE}:job\n")


def test_a_job_installed_while_the_server_runs_shows_its_input_lag(
    client_for: ClientFor,
    lineage: Lineage,
    site: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(health, "RETRY_LOAD_AFTER_S", 0.0)
    lineage.version.job = "late-job"
    lineage.version.save(update_fields=["job"])
    job = Job.objects.select_related("version").get(pk=lineage.job.pk)
    [before] = health.job_health([job])
    assert before.backlog is None  # not installed: the source is unknown here

    install(site)
    [after] = health.job_health([job])
    assert after.backlog is not None and after.backlog.unit == "bytes"
    page = client_for("viewer").get("/").content.decode()
    assert 'title="the source does not report a backlog"' not in page
