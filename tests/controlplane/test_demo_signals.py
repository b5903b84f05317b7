"""Stopping the serving demo the ways a user does: SIGTERM (`kill`, a supervisor) and SIGHUP
(a closed terminal). Each stops the workers, then the job at an epoch boundary, and leaves no
process of the demo's tree alive (the demo, its Celery workers and beat, the Spark job's
process group). The second run resumes: it prints its login and URL again, one line about
the history instead of every old epoch, then the new epochs while serving. While serving, the
demo hands out its static files and our 404 page without DEBUG. (SIGINT and SIGKILL, and
jobs of the user's own: tests/controlplane/test_demo_restart.py.)"""

from __future__ import annotations

import json
import re
import signal
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from snapshots_store import Repository
from tests.demo_process import APPLICATION, Demo

pytestmark = [pytest.mark.spark]

EPOCH_LINE = re.compile(r"^  epoch +(\d+) ")


def printed_epochs(lines: list[str]) -> list[int]:
    return [int(m[1]) for line in lines if (m := EPOCH_LINE.match(line))]


def describe(pids: list[int]) -> str:
    out = []
    for pid in pids:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            out.append(f"{pid}: {command.decode(errors='replace')}")
        except OSError:
            out.append(f"{pid}: (gone)")
    return "\n".join(out)


def stopped_at_an_epoch_boundary(var_dir: Path) -> None:
    """Every run was stopped by its stop request (the engine ends after a whole epoch), none
    forced by a signal at the deadline; the branch head is a readable committed snapshot."""
    runs = sorted((var_dir / "runs").glob("*/stop.json"))
    assert runs, "no run was asked to stop"
    for stop in runs:
        assert "forced" not in json.loads(stop.read_text()), stop.read_text()
    repo = Repository.open(f"file://{var_dir / 'store'}", APPLICATION)
    ref = repo.read_ref("heads/main")
    assert ref is not None
    assert repo.read_manifest(ref.target).kind in ("epoch", "rescale", "initial")


def served_without_debug(demo: Demo) -> None:
    """The demo serves its static files itself and answers an unknown path with our 404
    page, never Django's debug page (it runs without DEBUG); no request log lines."""
    with urllib.request.urlopen(f"{demo.url}/static/web/app.css", timeout=30) as css:
        assert css.status == 200 and b".state-unknown" in css.read()
    try:
        urllib.request.urlopen(f"{demo.url}/no/such/page/", timeout=30)
        raise AssertionError("an unknown path answered 200")
    except urllib.error.HTTPError as exc:
        body = exc.read().decode()
        assert exc.code == 404 and "There is no page at /no/such/page/" in body, body[:500]
        assert "URLconf" not in body
    assert not any('"GET /static/web/app.css' in line for line in demo.lines), demo.output


def spark_ui_served(demo: Demo) -> None:
    """The banner's Spark UI link is the running job's UI through the control plane: after
    the demo's login it answers with Spark's own jobs page (the proxy follows Spark's
    redirect to it), its links pointing back through the proxy."""
    [link] = [line.split("Spark UI:", 1)[1].strip() for line in demo.lines if "Spark UI:" in line][
        :1
    ]
    assert link == f"{demo.url}/jobs/clickstream-main/spark-ui/", demo.output
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
    with opener.open(f"{demo.url}/login/", timeout=30) as page:
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.read().decode())
    assert token is not None
    form = urllib.parse.urlencode(
        {"username": "admin", "password": "epochal-demo", "csrfmiddlewaretoken": token[1]}
    ).encode()
    opener.open(f"{demo.url}/login/", data=form, timeout=30).close()
    with opener.open(link, timeout=60) as ui:
        html = ui.read().decode()
        assert ui.status == 200 and ui.url.endswith("/spark-ui/jobs/"), ui.url
    assert "Spark Jobs" in html and 'href="/jobs/clickstream-main/spark-ui/' in html, html[:500]


def run_and_signal(var_dir: Path, signum: signal.Signals, batches: str) -> Demo:
    demo = Demo(var_dir, "--input-batches", batches, "--records", "300", "--feed-every", "2")
    try:
        login = demo.wait_for_line("login:", timeout=120)
        assert "user admin, password epochal-demo" in demo.lines[login], demo.output
        assert demo.url in demo.lines[login]
        banner = demo.wait_for_line("Dashboard:", timeout=600)
        assert "user admin, password epochal-demo" in demo.lines[banner]
        demo.wait_serving()
        served_without_debug(demo)
        spark_ui_served(demo)
        # new input arrives every 2 s: each new epoch is printed while serving
        demo.wait_for_line("  epoch", start=banner + 1, timeout=300)
        demo.signal(signum)
        left = demo.processes()
        assert left == [], f"alive after {signum.name}:\n{describe(left)}\n{demo.output}"
    finally:
        demo.kill_everything()
    assert f"{signum.name} received: stopping" in demo.output, demo.output
    assert "stopped 1 run(s) at an epoch boundary" in demo.output, demo.output
    assert "workers stopped" in demo.output
    stopped_at_an_epoch_boundary(var_dir)
    return demo


@pytest.mark.timeout(1500)
def test_sigterm_and_sighup_stop_everything_and_a_restart_resumes(tmp_path: Path) -> None:
    var_dir = tmp_path / "var"
    first = run_and_signal(var_dir, signal.SIGTERM, "2")
    before = printed_epochs(first.lines)
    assert before and before == sorted(before), first.output

    second = run_and_signal(var_dir, signal.SIGHUP, "1")
    resumed = second.lines[second.wait_for_line("resuming: main has", timeout=1)]
    head = int(re.search(r"head epoch (\d+)", resumed)[1])  # type: ignore[index]
    assert head >= before[-1], second.output
    again = printed_epochs(second.lines)
    assert again and min(again) > head, f"old epochs printed again:\n{second.output}"
