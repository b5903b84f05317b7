"""What the Spark UI costs an epoch: ``python -m bench.engine --parts spark_ui``.

A SparkContext's UI is fixed when it starts, so the part runs the vectorised engine work (the
same generated epochs, the engine variant, checksums checked) in child processes of
``bench.engine``, one with ``--spark-ui on`` and one with ``--spark-ui off``, alternating
`ROUNDS` times. ``spark_ui_cost_ratio`` is the median engine rate with the UI off ÷ the
median with it on: how much longer an epoch takes while the driver serves the UI and its
listeners record every job, stage and task (1.0: no cost). Every child's rate is in
``spark_ui_runs``; a child whose UI was not as asked (its report's ``spark_ui`` address) or
whose checksums did not match fails the run.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any, Final

ROUNDS: Final = 3
#: the check: the UI may cost an epoch at most this much (docs/control-plane.md)
TARGET_RATIO: Final = 1.15


def child_argv(bench: Any, ui: str) -> list[str]:
    s = bench.sizes
    return [
        sys.executable, "-m", "bench.engine", "--parts", "vectorised", "--variants", "engine",
        "--spark-ui", ui, "--keys", str(s.keys), "--records", str(s.records),
        "--epochs", str(s.epochs), "--warm-keys", str(s.warm_keys),
    ]  # fmt: skip


def measure(bench: Any, link_files: Any, child_report: Any) -> dict[str, Any]:
    """The figures of the part; problems go to `bench.problems`."""
    s = bench.sizes
    data = bench.dataset("vectorised", keys=s.keys, records=s.records, epochs=s.epochs)
    runs: dict[str, list[float | None]] = {"off": [], "on": []}
    for i in range(ROUNDS):
        for ui in ("off", "on"):
            work = Path(bench.work) / f"spark-ui-{ui}-{i}"
            link_files(data.directory, work / "data" / "vectorised")
            child, failure = child_report(child_argv(bench, ui), work)
            if failure is None and child is not None:
                if child.get("checksums_match") is not True:
                    failure = f"checksums did not match: {child.get('checksum_problems')}"
                elif bool(child.get("spark_ui")) != (ui == "on"):
                    failure = f"the child's UI was {child.get('spark_ui')!r}, asked {ui}"
            rate = None if failure is not None or child is None else child.get("engine_rps")
            if failure is not None:
                bench.problems.append(f"spark_ui {ui} round {i + 1}: {failure}")
            runs[ui].append(rate)
    medians = {
        ui: statistics.median([r for r in rates if r is not None]) if any(rates) else None
        for ui, rates in runs.items()
    }
    ratio = round(medians["off"] / medians["on"], 3) if medians["off"] and medians["on"] else None
    if ratio is not None and ratio > TARGET_RATIO:
        bench.problems.append(
            f"spark_ui_cost_ratio {ratio} is above its target {TARGET_RATIO} (the UI makes an "
            "epoch that much longer)"
        )
    return {
        "spark_ui_cost_ratio": ratio,
        "spark_ui_cost_target": TARGET_RATIO,
        "spark_ui_rps": medians,
        "spark_ui_runs": runs,
    }
