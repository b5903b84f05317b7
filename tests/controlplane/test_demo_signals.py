"""Stopping the serving demo the ways a user does: SIGTERM (`kill`, a supervisor) and SIGHUP
(a closed terminal). Each stops the job at an epoch boundary through a stop operation and
leaves no process of the demo's tree alive (the demo, its Celery worker and beat, the Spark
job's process group). The second run resumes: it prints its login and URL again, one line
about the history instead of every old epoch, then the new epochs while serving."""

from __future__ import annotations

import json
import re
import signal
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


def run_and_signal(var_dir: Path, signum: signal.Signals, batches: str) -> Demo:
    demo = Demo(var_dir, "--input-batches", batches, "--records", "300", "--feed-every", "2")
    try:
        login = demo.wait_for_line("login:", timeout=120)
        assert "user admin, password epochal-demo" in demo.lines[login], demo.output
        assert demo.url in demo.lines[login]
        banner = demo.wait_for_line("Dashboard:", timeout=600)
        assert "user admin, password epochal-demo" in demo.lines[banner]
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
