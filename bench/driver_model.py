"""The driver part's cost model: per (M, p) point, the driver's seconds per epoch, and a
least-squares fit ``t = a + b*M + c*p`` with its R², extrapolated to 1,000 tasks.

Two figures per point, from the committed manifests (median over epochs 2..):

- ``driver_s``: the driver's own serial work, measured directly: ``process_s - tasks_wall_s``
  (reading the control document and the parent manifest, planning, building the manifest)
  plus the commit (manifest write and ref CAS);
- ``driver_and_spark_s``: that plus Spark's own per-epoch cost on the driver side
  (``tasks_wall_s`` less ceil(p / cores) waves of the task critical path, clipped at 0):
  job and task scheduling, the exchange, collecting one report per task.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

FORMULA = "t = a + b*M + c*p"
TARGETS = ("driver_s", "driver_and_spark_s")


def driver_point(
    m: int, p: int, cores: int, detail: dict[str, Any], task_s: Sequence[float], epoch_s: float
) -> dict[str, Any]:
    """One (M, p) point from a run's per-epoch manifest detail (epoch 1 creates the state and
    is left out)."""
    waves = -(-p // cores)
    own, spark = [], []
    for i in range(1, len(task_s)):
        wall = float(detail["tasks_wall_s"][i] or 0)
        commit = float(detail["commit_ms"][i]) / 1000
        own.append(float(detail["process_s"][i] or 0) - wall + commit)
        spark.append(max(0.0, wall - waves * float(task_s[i])))
    return {
        "max_parallelism": m,
        "parallelism": p,
        "routing": detail["routing"][-1],
        "driver_s": round(statistics.median(own), 4),
        "driver_and_spark_s": round(
            statistics.median(o + s for o, s in zip(own, spark, strict=True)), 4
        ),
        "task_s": round(statistics.median(task_s[1:]), 4),
        "task_waves": waves,
        "epoch_s": round(epoch_s, 4),
        "commit_ms": round(statistics.median(detail["commit_ms"][1:]), 1),
    }


def fit(points: Sequence[dict[str, Any]], target: str) -> dict[str, Any]:
    """Least squares of ``points[target]`` on (1, M, p): coefficients and R²."""
    a = np.array([[1.0, pt["max_parallelism"], pt["parallelism"]] for pt in points])
    t = np.array([float(pt[target]) for pt in points])
    coef, *_ = np.linalg.lstsq(a, t, rcond=None)
    predicted = a @ coef
    total = float(np.sum((t - t.mean()) ** 2))
    residual = float(np.sum((t - predicted) ** 2))
    r2 = 1.0 - residual / total if total > 0 else 1.0
    c0, c_m, c_p = (float(c) for c in coef)
    return {
        "a_s": round(c0, 5),
        "b_s_per_key_group": float(f"{c_m:.3g}"),
        "c_s_per_task": float(f"{c_p:.3g}"),
        "r2": round(r2, 4),
        "max_abs_residual_s": round(float(np.max(np.abs(t - predicted))), 4),
        "at_1000_tasks_m32768_s": round(c0 + c_m * 32768 + c_p * 1000, 3),
    }


def fit_driver_model(points: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Both fits (see the module doc), on every point."""
    model: dict[str, Any] = {"formula": FORMULA, "points": len(points)}
    for target in TARGETS:
        model[target] = fit(points, target)
    return model
