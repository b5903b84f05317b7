"""Small helpers shared by the engine benchmark: progress log, variant results, peak RSS."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from bench.checksum import Checksum


def log(message: str) -> None:
    print(f"[bench.engine {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class VariantResult:
    """One variant's run over one EpochSet: wall time, per-epoch seconds and checksums."""

    name: str
    records: int
    seconds: float
    epoch_seconds: list[float] = field(default_factory=list)
    checksums: list[Checksum] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    cpu_s: float = 0.0  # CPU seconds of the whole process tree while the variant ran

    @property
    def rps(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def steady_epoch_s(self) -> float:
        """Median seconds per epoch, leaving out the first (state creation, first compile)."""
        rest = self.epoch_seconds[1:] or self.epoch_seconds
        return statistics.median(rest) if rest else 0.0

    def summary(self) -> str:
        per = ", ".join(f"{s:.2f}" for s in self.epoch_seconds)
        return (
            f"{self.name}: {self.records:,} records in {self.seconds:.2f} s = {self.rps:,.0f} "
            f"records/s ({self.cpu_s:.1f} CPU s); s/epoch [{per}]"
        )


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list; 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may contain spaces, so split after the last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_mb(root: int | None = None) -> float:
    """Resident memory of a process and all its descendants (the driver, its JVM, workers)."""
    pids = _tree_pids(os.getpid() if root is None else root)
    return sum(_rss_kib(pid) for pid in pids) / 1024


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _own_ticks(pid: int) -> tuple[int, int] | None:
    """(start time, utime + stime) of one process, its own CPU only (no reaped children)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    # After "pid (comm) ": utime=11 stime=12 ... starttime=19
    return int(fields[19]), int(fields[11]) + int(fields[12])


def _tree_pids(root: int) -> list[int]:
    children = _children_map()
    pids, stack = [], [root]
    while stack:
        pid = stack.pop()
        pids.append(pid)
        stack.extend(children.get(pid, ()))
    return pids


class _TreeSampler:
    """Samples the process tree in a daemon thread every `interval` seconds while a ``with``
    block runs: once on entry, periodically, and once on exit."""

    def __init__(self, interval: float, name: str) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _sample(self) -> None:
        raise NotImplementedError

    def _entered(self) -> None:
        """After the first sample, before the periodic ones."""

    def _exited(self) -> None:
        """After the last sample."""

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> Self:
        self._sample()
        self._entered()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        self._exited()


class TreeCpu(_TreeSampler):
    """CPU seconds a process and its descendants (driver, JVM, Python workers) use inside a
    ``with`` block. Much less sensitive than wall time to other work on the machine: the bench
    reports it per variant next to the wall-clock rates.

    Not a difference of two readings of the tree's totals: a process that exits inside the
    window (a Python worker Spark retires, a child's JVM) takes its CPU with it unless a
    process of the tree reaps it, which made such differences too small or even negative. The
    tree is sampled every `interval` seconds instead, and each process (pid and start time)
    counts its own CPU from its first sample (0 when it was born inside the window) to its
    last; only what a process used after its last sample (under `interval`) is missed.
    """

    def __init__(self, root: int | None = None, interval: float = 0.2) -> None:
        super().__init__(interval, "tree-cpu")
        self.root = os.getpid() if root is None else root
        self.seconds = 0.0
        self._first: dict[tuple[int, int], int] = {}
        self._last: dict[tuple[int, int], int] = {}
        self._started = False

    def _sample(self) -> None:
        for pid in _tree_pids(self.root):
            ticks = _own_ticks(pid)
            if ticks is None:
                continue
            key = (pid, ticks[0])
            self._first.setdefault(key, ticks[1] if not self._started else 0)
            self._last[key] = ticks[1]

    def _entered(self) -> None:
        self._started = True

    def _exited(self) -> None:
        ticks = sum(last - self._first[key] for key, last in self._last.items())
        self.seconds = ticks / _CLK_TCK


class PeakRss(_TreeSampler):
    """Samples `tree_rss_mb` in a daemon thread every `interval` seconds; keeps the peak."""

    def __init__(self, interval: float = 0.25) -> None:
        super().__init__(interval, "peak-rss")
        self.peak_mb = 0.0
        self.peaks: dict[str, float] = {}
        self._phase = "start"

    def phase(self, name: str) -> None:
        self._phase = name

    def _sample(self) -> None:
        mb = tree_rss_mb()
        self.peak_mb = max(self.peak_mb, mb)
        self.peaks[self._phase] = max(self.peaks.get(self._phase, 0.0), mb)


def code_version(repo: Path, *paths: str, dirty_key: str = "tree_dirty") -> dict[str, Any]:
    """The commit measured: git when run in the repository (and whether `paths` have changes
    not committed), else $BENCH_GIT_COMMIT (a copy of the tree)."""
    git = ["git", "-C", str(repo)]
    try:
        commit = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--", *paths],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        return {"git_commit": commit, dirty_key: bool(dirty)}
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": os.environ.get("BENCH_GIT_COMMIT"), dirty_key: False}
