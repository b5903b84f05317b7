"""The README's path, end to end, as a new user walks it on the embedded default: `bin/demo
--no-serve` (the demo's own command), then the serving demo, a rescale and a rollback from a
second shell through the `epochal` command, `GET /metrics` scraped over HTTP after each, the
dashboard's pages read in Chromium, SIGTERM to the demo, a restart that resumes from the branch
head. Real Spark, the demo's real Celery
worker on its filesystem broker, SQLite — nothing of the test's services."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from snapshots_store import Repository
from tests.demo_process import APPLICATION, JOB, ROOT, Demo, demo_env
from tests.web.browser import chromium, watched

pytestmark = [pytest.mark.spark]

EPOCH_LINE = re.compile(r"^  epoch +(\d+) +(\w+) .* p=(\d+) ")


def epochal(var_dir: Path, *args: str) -> str:
    """`.venv/bin/epochal ARGS` from a second shell in the repository, as the README says."""
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "epochal"), *args],
        cwd=ROOT,
        env=demo_env(var_dir),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"epochal {' '.join(args)}:\n{done.stdout}{done.stderr}"
    return done.stdout


def token(var_dir: Path) -> str:
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), "manage.py", "token", "admin"],
        cwd=ROOT,
        env=demo_env(var_dir),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip().splitlines()[-1]


def scrape(demo: Demo, api_token: str, after: str) -> dict[tuple[str, str], float]:
    """GET /metrics from the demo's server; operations by (kind, state)."""
    request = urllib.request.Request(
        f"{demo.url}/metrics", headers={"Authorization": f"Token {api_token}"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200, f"/metrics after {after}: {response.status}"
        text = response.read().decode()
    return {
        (s.labels["kind"], s.labels["state"]): s.value
        for family in text_string_to_metric_families(text)
        if family.name == "epochal_operations"
        for s in family.samples
    }


def head(var_dir: Path) -> tuple[str, int, int]:
    repo = Repository.open(f"file://{var_dir / 'store'}", APPLICATION)
    ref = repo.read_ref("heads/main")
    assert ref is not None
    manifest = repo.read_manifest(ref.target)
    return ref.target, manifest.epoch, manifest.parallelism


def no_process_left(demo: Demo) -> None:
    left = demo.processes()
    assert left == [], f"processes of the demo still alive: {left}\n{demo.output}"
    for stop in (demo.var_dir / "runs").glob("*/stop.json"):
        assert "forced" not in json.loads(stop.read_text()), stop.read_text()


def the_pages_tell_the_truth(demo: Demo, *, epochs_at_least: int) -> None:
    """The dashboard of the serving demo after the README's rescale and rollback, in Chromium:
    the job is running (not `unknown`) and its source reports its lag; the operations list
    filters to the rollback, whose page says who asked, how, and how long each phase took,
    in words; the exceptions, log and checkpoint tabs show this job's runs and commits; a page
    that does not exist is our 404, not Django's debug page; nothing left localhost and no
    script failed."""
    with chromium() as browser:
        seen = watched(browser, demo.url)
        page = seen.page
        try:
            seen.login("admin", "epochal-demo")
            row = page.locator(f'[data-job="{JOB}"]')
            assert row.locator("[data-testid=job-state]").inner_text() == "RUNNING"

            seen.go(f"/jobs/{JOB}/")
            note = page.inner_text("[data-testid=input-lag-note]")
            assert "unknown" not in note, note  # the demo's source reports its lag

            seen.go("/operations/?kind=rollback")
            rows = page.locator("[data-testid=operations] tbody tr")
            assert rows.count() == 1
            seen.follow("[data-testid=operations] tbody tr a >> text=rollback")
            assert page.inner_text("[data-testid=operation-state]") == "succeeded"
            assert "the command line (epochal)" in page.inner_text("[data-testid=asked-by]")
            durations = page.locator("[data-testid=phase-duration]").all_inner_texts()
            assert durations and all(d.endswith(" s") for d in durations), durations
            words = page.inner_text("main")
            assert "{'" not in words and "True" not in words, words

            seen.go(f"/jobs/{JOB}/exceptions/")
            seen.go(f"/jobs/{JOB}/log/")
            page.wait_for_function(
                "document.querySelector('[data-testid=log] pre').textContent.includes('epoch')"
            )
            seen.go(f"/jobs/{JOB}/checkpoints/")
            history = page.inner_text("[data-testid=checkpoints]")
            assert page.locator("[data-testid=checkpoints] tbody tr").count() >= epochs_at_least
            # the branch's line: the rollback commit (at p=3) on the epochs it went back to;
            # the rescale is on the line the rollback left behind
            rollback = [line for line in history.splitlines() if "\trollback\t" in line]
            assert len(rollback) == 1 and "\t3\t" in rollback[0], history

            response = seen.go("/no/such/page/")
            assert response is not None and response.status == 404
            assert "URLconf" not in page.content()
            seen.console_errors = [e for e in seen.console_errors if "404" not in e]
            seen.assert_clean()
        finally:
            seen.context.close()


@pytest.mark.timeout(2400)
def test_the_readme_path(tmp_path: Path) -> None:
    var_dir = tmp_path / "var"

    # bin/demo --no-serve --input-batches 2: commits the input's epochs, stops everything
    first = Demo(var_dir, "--no-serve", "--input-batches", "2", "--records", "300")
    try:
        assert first.proc.wait(timeout=900) == 0, first.output
        first._reader.join(timeout=10)
        assert "the job has consumed all 600 input records" in first.output, first.output
        no_process_left(first)
    finally:
        first.kill_everything()
    sid, epoch, p = head(var_dir)
    assert p == 2

    # bin/demo: resumes and serves; a second shell rescales and rolls back
    demo = Demo(var_dir, "--input-batches", "1", "--records", "300", "--feed-every", "3")
    try:
        demo.wait_serving()
        assert "user admin, password epochal-demo" in demo.output
        assert f"head epoch {epoch}" in demo.output  # a summary, not the history again
        api_token = token(var_dir)
        assert scrape(demo, api_token, "start")[("start", "succeeded")] >= 2

        out = epochal(var_dir, "rescale", JOB, "-p", "3")
        assert "rescale succeeded" in out, out
        assert re.search(r"step 1/\d+ +\w+ +running", out), out  # progress moves with the steps
        assert head(var_dir)[2] == 3
        assert scrape(demo, api_token, "rescale")[("rescale", "succeeded")] == 1

        out = epochal(var_dir, "rollback", JOB, "--to", sid[:16], "--reason", "README path")
        assert "rollback succeeded" in out, out
        rolled_back, _, p = head(var_dir)
        assert p == 3  # a rollback returns to the state and offsets, not to p=2
        assert scrape(demo, api_token, "rollback")[("rollback", "succeeded")] == 1

        # the job goes on from the rollback at p=3, and the demo prints its new epochs
        printed = len(demo.lines)
        demo.wait_for_line("p=3", start=printed, timeout=300)

        # what the pages say about it, in Chromium, as the user would look
        the_pages_tell_the_truth(demo, epochs_at_least=epoch)
        demo.signal(signal.SIGTERM)
        no_process_left(demo)
        assert "stopped 1 run(s) at an epoch boundary" in demo.output, demo.output
    finally:
        demo.kill_everything()
    stopped_at, stopped_epoch, _ = head(var_dir)
    repo = Repository.open(f"file://{var_dir / 'store'}", APPLICATION)
    first_parents = [s for s, _ in repo.log(stopped_at, first_parent=True)]
    assert rolled_back in first_parents and sid in first_parents

    # restart: resumes from the branch head at p=3, prints only new epochs
    again = Demo(var_dir, "--input-batches", "1", "--records", "300", "--feed-every", "3")
    try:
        again.wait_serving()
        assert f"head epoch {stopped_epoch}" in again.output, again.output
        new = again.wait_for_line("  epoch", timeout=300)
        m = EPOCH_LINE.match(again.lines[new])
        assert m and int(m[1]) > stopped_epoch and m[3] == "3", again.output
        again.signal(signal.SIGTERM)
        no_process_left(again)
    finally:
        again.kill_everything()
