"""Small helpers shared by the engine benchmark: progress log, variant results, peak RSS."""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

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
    root = os.getpid() if root is None else root
    children = _children_map()
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += _rss_kib(pid)
        stack.extend(children.get(pid, ()))
    return total / 1024


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_ticks(pid: int) -> int:
    """utime + stime + cutime + cstime of one process (reaped children included)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return 0
    fields = stat[stat.rfind(b")") + 2 :].split()
    # After "pid (comm) ": state=0 ppid=1 ... utime=11 stime=12 cutime=13 cstime=14
    return sum(int(x) for x in fields[11:15])


def tree_cpu_s(root: int | None = None) -> float:
    """CPU seconds used so far by a process and its descendants (driver, JVM, Python workers).

    Much less sensitive than wall time to other work on the machine: the bench reports it per
    variant next to the wall-clock rates.
    """
    root = os.getpid() if root is None else root
    children = _children_map()
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += _cpu_ticks(pid)
        stack.extend(children.get(pid, ()))
    return total / _CLK_TCK


class PeakRss:
    """Samples `tree_rss_mb` in a daemon thread every `interval` seconds; keeps the peak."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.peak_mb = 0.0
        self.peaks: dict[str, float] = {}
        self._phase = "start"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-rss", daemon=True)

    def phase(self, name: str) -> None:
        self._phase = name

    def _sample(self) -> None:
        mb = tree_rss_mb()
        self.peak_mb = max(self.peak_mb, mb)
        self.peaks[self._phase] = max(self.peaks.get(self._phase, 0.0), mb)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> PeakRss:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
