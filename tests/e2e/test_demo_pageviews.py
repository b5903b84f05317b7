"""`bin/demo --job pageviews`: the event-time example end to end on the embedded default, as a
user runs it — its epochs print their watermark and late records, the line it prints to read
the output reads the closed windows, and the job page it points at shows the watermark, the
event-time chart and the open windows per key group in Chromium. A bad combination of options
is refused in words."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.demo_process import ROOT, Demo, demo_env
from tests.web.browser import chromium, watched

pytestmark = [pytest.mark.spark]

JOB = "pageviews-main"


def test_pageviews_on_the_source_of_clicks_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", "demo", "--job", "pageviews", "--source", "kafka"],
        cwd=ROOT,
        env=demo_env(tmp_path / "var"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "--job pageviews reads generated Parquet files" in done.stderr, done.stderr


@pytest.mark.timeout(1800)
def test_the_pageviews_demo_shows_where_the_windows_are(tmp_path: Path) -> None:
    var_dir = tmp_path / "var"
    demo = Demo(
        var_dir, "--job", "pageviews", "--input-batches", "3", "--records", "300",
        "--feed-every", "5",
    )  # fmt: skip
    try:
        demo.wait_serving(timeout=900)
        out = demo.output
        assert f"Windows:    {demo.url}/jobs/{JOB}/" in out, out
        epochs = [line for line in demo.lines if line.startswith("  epoch ")]
        assert epochs and all(" windows out " in line for line in epochs), out
        assert any(" watermark 20" in line for line in epochs), out
        reader = next(
            demo.lines[i + 1].strip()
            for i, line in enumerate(demo.lines)
            if line.startswith("output: one row per page and closed window")
        )
        read = subprocess.run(
            ["bash", "-c", reader],
            cwd=ROOT,
            env=demo_env(var_dir),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert read.returncode == 0, read.stderr
        assert "window_start" in read.stdout and "/pricing" in read.stdout, read.stdout
        with chromium() as browser:
            seen = watched(browser, demo.url)
            page = seen.page
            try:
                seen.login("admin", "epochal-demo")
                seen.go(f"/jobs/{JOB}/")
                stat = page.inner_text("[data-testid=watermark]")
                assert "behind" in stat and "late in the last epoch" in stat, stat
                page.wait_for_function(
                    "document.getElementById('chart-event-time').dataset.version"
                )
                counts = page.locator("[data-testid=open-windows]").all_inner_texts()
                assert counts and sum(int(c.replace(",", "")) for c in counts) > 0, counts
                seen.assert_clean()
            finally:
                seen.context.close()
        assert demo.signal(signal.SIGINT) == 0, demo.output
        left = demo.processes()
        assert left == [], f"processes of the demo still alive: {left}\n{demo.output}"
    finally:
        demo.kill_everything()
