"""Two control-plane replicas, each with its own beat, ticking the same periodic role: the one
holding the PostgreSQL lease acts, once per interval, never both; when the leader dies the other
takes over within an interval or two. Counted from what each replica did."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.api.conftest import current_database_url
from tests.conftest import SUBPROCESS_PYTHONPATH
from tests.faults.report import injections, record

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
INTERVAL_S = 0.5


def _acts(path: Path) -> list[tuple[int, float]]:
    if not path.exists():
        return []
    return [(int(p), float(t)) for p, t in (line.split() for line in path.read_text().splitlines())]


def test_two_replicas_act_once_per_interval_and_fail_over(tmp_path: Path) -> None:
    out = tmp_path / "acts"
    env = {**os.environ, "DATABASE_URL": current_database_url(),
           "PYTHONPATH": SUBPROCESS_PYTHONPATH}  # fmt: skip
    cmd = [sys.executable, "-m", "tests.faults.replica", f"test-role-{os.getpid()}",
           str(INTERVAL_S), "300", str(out)]  # fmt: skip
    replicas = {}
    for _ in range(2):
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
        replicas[proc.pid] = proc
    takeovers: list[float] = []
    leaders: list[int] = []
    wanted = injections()
    try:
        deadline = time.monotonic() + 60 + 15 * wanted
        for _ in range(wanted):
            seen = len(_acts(out))
            while len(_acts(out)) < seen + 3:  # the current leader acts a few times
                assert time.monotonic() < deadline, "no replica acted"
                time.sleep(0.05)
            leader = _acts(out)[-1][0]
            leaders.append(leader)
            killed_at = time.time()
            replicas.pop(leader).kill()  # its session ends: the server releases the lock
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env)  # a replacement: two replicas again
            replicas[proc.pid] = proc
            while _acts(out)[-1][0] == leader:
                assert time.monotonic() < deadline, "nobody took over"
                time.sleep(0.05)
            takeovers.append(next(t for p, t in _acts(out) if t > killed_at) - killed_at)
    finally:
        for replica in replicas.values():
            replica.kill()
            replica.wait()
    acts = _acts(out)
    times = [t for _, t in acts]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    duplicated = sum(gap < 0.9 * INTERVAL_S / 2 for gap in gaps)  # 10%: clocks of two processes
    assert duplicated == 0, gaps  # never two acts for one tick, not even across a takeover
    runs = [pid for i, (pid, _) in enumerate(acts) if i == 0 or acts[i - 1][0] != pid]
    assert len(runs) == len(set(runs)) == wanted + 1  # one leader at a time, each once
    assert max(takeovers) < 10, takeovers
    record("control_plane_replicas", injected=wanted, survived=wanted, lost=0,
           duplicated=duplicated, recover_s=takeovers)  # fmt: skip
