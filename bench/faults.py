"""Fault-injection benchmark: every fault class of tests/faults, injected many times.

    python -m bench.faults [--injections 20] [--runs 1] [--json-out PATH]

Runs the fault suite (``pytest tests/faults -m faults``) in a child process with
``$EPOCHAL_FAULT_INJECTIONS`` (each scenario injects at least that many faults of its class)
and collects what each scenario reports (tests/faults/report.py). Per fault class: `injected`,
`survived` (the job's output equal to a fault-free run, operations converged, the store clean),
`lost` and `duplicated` (both must be 0) and `time_to_recover_s` p50/p99 — seconds from the end
of a fault (the database back, the volume grown, the store answering) to the first success
after it, or the whole of an operation that met faults. The baseline is each scenario's own
fault-free reference inside the run (equal output, equal history). Load averages before and
after each run are recorded (the machine is shared: a slow figure under load is no verdict).

Checks (exit status 1 when any fails): the suite passed, every class of `EXPECTED_CLASSES`
reported (unless pytest arguments pick some scenarios), every class injected at least
`--injections` faults (the job-level store class: at least 1 outage per run), nothing lost,
nothing duplicated, every injection survived.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: Classes whose scenario injects one outage per run (plus random faults around it).
PER_RUN_CLASSES = {"object_store_job"}
#: Every class the fault suite reports; a full run (no pytest filter) must report
#: each of them.
EXPECTED_CLASSES = frozenset(
    {
        "object_store",
        "object_store_job",
        "database",
        "database_operation",
        "broker",
        "broker_rabbitmq",
        "disk_full_store",
        "disk_full_cache",
        "damaged_object",
        "control_plane_replicas",
    }
)


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return round(ordered[index], 4)


def run_suite(injections: int, pytest_args: list[str]) -> dict[str, Any]:
    """One run of the fault suite; its per-class figures."""
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
        report = Path(tmp) / "report.jsonl"
        env = {**os.environ, "EPOCHAL_FAULT_INJECTIONS": str(injections),
               "EPOCHAL_FAULTS_REPORT": str(report)}  # fmt: skip
        load_before = os.getloadavg()
        began = time.monotonic()
        cmd = [sys.executable, "-m", "pytest", "tests/faults", "-m", "faults", "-q",
               "-p", "no:cacheprovider", *pytest_args]  # fmt: skip
        print(f"bench.faults: {' '.join(cmd)} (injections {injections})", file=sys.stderr)
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        elapsed = time.monotonic() - began
        tail = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
        print(f"bench.faults: pytest exit {proc.returncode}: {tail}", file=sys.stderr)
        failed = [x for x in proc.stdout.splitlines() if x.startswith(("FAILED", "ERROR", "E  "))]
        for line in failed[:40]:
            print(f"bench.faults: {line}", file=sys.stderr)
        lines = [json.loads(x) for x in report.read_text().splitlines()] if report.exists() else []
    classes: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"injected": 0, "survived": 0, "lost": 0, "duplicated": 0, "recover": []}
    )
    for line in lines:
        entry = classes[line["class"]]
        for name in ("injected", "survived", "lost", "duplicated"):
            entry[name] += int(line[name])
        entry["recover"].extend(float(s) for s in line["recover_s"])
    figures = {
        name: {
            "injected": c["injected"],
            "survived": c["survived"],
            "lost": c["lost"],
            "duplicated": c["duplicated"],
            "time_to_recover_s": {
                "p50": _percentile(c["recover"], 0.5),
                "p99": _percentile(c["recover"], 0.99),
                "n": len(c["recover"]),
            },
        }
        for name, c in sorted(classes.items())
    }
    return {
        "pytest_exit": proc.returncode,
        "pytest_summary": tail[0] if tail else "",
        "pytest_failed": [x for x in failed if x.startswith(("FAILED", "ERROR"))],
        "elapsed_s": round(elapsed, 1),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "classes": figures,
    }


def check(run: dict[str, Any], injections: int, *, filtered: bool = False) -> list[str]:
    """What is wrong with `run`; `filtered`: pytest was asked for some scenarios only (so
    classes it did not run are not missing)."""
    failures = []
    if run["pytest_exit"] != 0:
        failures.append(f"the fault suite failed: {run['pytest_summary']}")
    if not run["classes"]:
        failures.append("no scenario reported anything")
    missing = sorted(EXPECTED_CLASSES - set(run["classes"]))
    if missing and not filtered:
        failures.append(f"no scenario reported the classes {missing}")
    for name, c in run["classes"].items():
        wanted = 1 if name in PER_RUN_CLASSES else injections
        if c["injected"] < wanted:
            failures.append(f"{name}: {c['injected']} injections < {wanted}")
        if c["lost"] or c["duplicated"]:
            failures.append(f"{name}: lost {c['lost']}, duplicated {c['duplicated']}")
        if c["survived"] != c["injected"]:
            failures.append(f"{name}: survived {c['survived']} of {c['injected']}")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__)
    parser.add_argument("--injections", type=int, default=20,
                        help="faults per class and scenario (CI's suite makes 2)")  # fmt: skip
    parser.add_argument("--runs", type=int, default=1, help="runs of the whole suite")
    parser.add_argument("--json-out", default=None, help="also write the report here")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (e.g. -k store)")
    args = parser.parse_args(argv)
    if args.injections < 1 or args.runs < 1:
        parser.error("--injections and --runs must be >= 1")
    runs = [run_suite(args.injections, args.pytest_args) for _ in range(args.runs)]
    failures = [
        f"run {i + 1}: {f}"
        for i, run in enumerate(runs)
        for f in check(run, args.injections, filtered=bool(args.pytest_args))
    ]
    names = sorted({name for run in runs for name in run["classes"]})
    median = {
        name: {
            "time_to_recover_s_p50": statistics.median(
                [
                    r["classes"][name]["time_to_recover_s"]["p50"] or 0.0
                    for r in runs
                    if name in r["classes"]
                ]
            ),
            "lost": sum(r["classes"].get(name, {}).get("lost", 0) for r in runs),
            "duplicated": sum(r["classes"].get(name, {}).get("duplicated", 0) for r in runs),
        }
        for name in names
    }
    report = {
        "bench": "faults",
        "injections_per_class": args.injections,
        "settings": {
            "store_retry": {k: v for k, v in os.environ.items() if k.startswith("EPOCHAL_STORE_")},
            "suite": "tests/faults -m faults",
            "cpus": os.cpu_count(),
        },
        "runs": runs,
        "median": median,
        "verdict": "met" if not failures else "missed",
        "failures": failures,
        "note": "under load: the machine is shared; recovery times include the load's delays",
    }
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
