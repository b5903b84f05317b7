"""What a fault test tells `bench.faults`: one JSON line per scenario run, appended to the file
named by ``$EPOCHAL_FAULTS_REPORT`` (nothing when unset: a plain test run). The number of
injections a test makes comes from ``$EPOCHAL_FAULT_INJECTIONS`` (the benchmark's full run asks
for 20 or more; the default suite makes its minimum of 2)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

REPORT_ENV = "EPOCHAL_FAULTS_REPORT"
INJECTIONS_ENV = "EPOCHAL_FAULT_INJECTIONS"


def injections(default: int = 2) -> int:
    raw = os.environ.get(INJECTIONS_ENV, "").strip()
    return max(default, int(raw)) if raw else default


def record(
    fault_class: str,
    *,
    injected: int,
    survived: int,
    lost: int,
    duplicated: int,
    recover_s: Sequence[float] = (),
) -> None:
    """Append one scenario's counts (`recover_s`: seconds from each fault's end to the first
    success after it)."""
    target = os.environ.get(REPORT_ENV)
    if not target:
        return
    line = {
        "class": fault_class,
        "injected": injected,
        "survived": survived,
        "lost": lost,
        "duplicated": duplicated,
        "recover_s": [round(s, 4) for s in recover_s],
    }
    with open(target, "a") as out:
        out.write(json.dumps(line) + "\n")
