"""`bench.timing.TreeCpu`: the CPU of processes that exit inside the window is counted, also
when no process of the tree reaps them (the flaw that gave a variant negative CPU seconds)."""

from __future__ import annotations

import subprocess
import sys
import time

from bench.timing import TreeCpu

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def test_a_child_that_exits_inside_the_window_is_counted() -> None:
    with TreeCpu(interval=0.05) as cpu:
        subprocess.run([sys.executable, "-c", BURN.format(s=0.6)], check=True)
    assert 0.5 <= cpu.seconds < 1.5


def test_a_grandchild_its_parent_never_reaps_is_counted() -> None:
    # The child starts a grandchild that burns CPU and exits, and never waits for it: the
    # grandchild's CPU reaches no reaped-children total of the tree (init reaps it once the
    # child is gone), so a difference of the tree's totals would not see it at all.
    spawn = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', {BURN.format(s=0.6)!r}])\n"
        "time.sleep(1.2)\n"
        "p.returncode = 0  # never waited for: left to init\n"
    )
    with TreeCpu(interval=0.05) as cpu:
        subprocess.run([sys.executable, "-c", spawn], check=True)
    assert cpu.seconds >= 0.5


def test_cpu_used_before_the_window_is_not_counted() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", BURN.format(s=0.5) + "time.sleep(1.5)\n"],
    )
    try:
        time.sleep(0.9)  # the child has burnt its CPU and sleeps
        with TreeCpu(interval=0.05) as cpu:
            time.sleep(0.3)
        assert cpu.seconds < 0.2
    finally:
        child.wait()
