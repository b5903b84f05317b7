"""python -m bench.sinks [--records-per-epoch N] [--epochs E] [--runs R] [--only KIND,…]

The cost of the exactly-once sinks: every module ``bench/sinks/<kind>.py`` with a
``measure(*, records_per_epoch, epochs, workdir) -> dict`` runs the same job with and without
its destination's sink in this process (bench/sinks/common.py), `--runs` times. Per kind: every
run's figures, the verdict on the median ``ratio_with_sink`` of the runs against the kind's
``target``, and ``exactly_once_checked`` (all runs). Prints one JSON object as the last line
(with the load averages before and after: on a shared machine a miss under load is no
verdict) and exits non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import bench.sinks

NOT_KINDS = {"common", "paired_runs"}


def kinds() -> list[str]:
    return sorted(
        m.name
        for m in pkgutil.iter_modules(bench.sinks.__path__)
        if not m.name.startswith("_") and m.name not in NOT_KINDS
    )


def verdict(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [float(r["ratio_with_sink"]) for r in runs]
    target = float(runs[0]["target"]["ratio_with_sink"])
    median = statistics.median(ratios)
    return {
        "ratio_with_sink_median": round(median, 3),
        "target_met": median >= target,
        "exactly_once_checked": all(bool(r["exactly_once_checked"]) for r in runs),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sinks")
    parser.add_argument("--records-per-epoch", type=int, default=1_000_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--only", default="", help="comma-separated kinds (default: all)")
    parser.add_argument("--workdir", default="", help="scratch directory (default: a temp one)")
    args = parser.parse_args(argv)
    if args.records_per_epoch < 1 or args.epochs < 1 or args.runs < 1:
        parser.error("--records-per-epoch, --epochs and --runs must be >= 1")
    chosen = [k for k in args.only.split(",") if k] or kinds()
    unknown = sorted(set(chosen) - set(kinds()))
    if unknown:
        parser.error(f"--only: no bench/sinks/{unknown[0]}.py (kinds: {', '.join(kinds())})")
    report: dict[str, Any] = {
        "benchmark": "sinks",
        "records_per_epoch": args.records_per_epoch,
        "epochs": args.epochs,
        "runs": args.runs,
        "cpus": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
        "destinations": {},
    }
    failed = []
    with tempfile.TemporaryDirectory(prefix="bench-sinks-", dir=args.workdir or None) as tmp:
        for kind in chosen:
            module = importlib.import_module(f"bench.sinks.{kind}")
            runs = []
            for n in range(args.runs):
                result = module.measure(
                    records_per_epoch=args.records_per_epoch,
                    epochs=args.epochs,
                    workdir=Path(tmp) / f"run{n}",
                )
                result["loadavg_1m"] = round(os.getloadavg()[0], 2)
                print(json.dumps({kind: result}), file=sys.stderr, flush=True)
                runs.append(result)
            summary = verdict(runs)
            report["destinations"][kind] = {"runs": runs, **summary}
            if not summary["exactly_once_checked"]:
                failed.append(f"{kind}: exactly_once_checked is false")
            if not summary["target_met"]:
                failed.append(f"{kind}: median ratio_with_sink below the target")
    report["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    report["failed_checks"] = failed
    print(json.dumps(report))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
