"""The driver part's cost model: the least-squares fit recovers known coefficients, its R²
says how well the model explains the points, and a point is read from manifest detail."""

from __future__ import annotations

import pytest

from bench.driver_model import driver_point, fit, fit_driver_model

GRID = [(128, 2), (4096, 2), (32768, 2), (4096, 1), (4096, 4), (4096, 8)]


def _points(noise: list[float]) -> list[dict[str, float]]:
    return [
        {
            "max_parallelism": m,
            "parallelism": p,
            "driver_s": 0.05 + 2e-5 * m + 0.004 * p + e,
            "driver_and_spark_s": 0.1 + 3e-5 * m + 0.01 * p,
        }
        for (m, p), e in zip(GRID, noise, strict=True)
    ]


def test_fit_recovers_exact_coefficients_with_r2_one() -> None:
    model = fit(_points([0.0] * 6), "driver_s")
    assert model["a_s"] == pytest.approx(0.05, abs=1e-6)
    assert model["b_s_per_key_group"] == pytest.approx(2e-5)
    assert model["c_s_per_task"] == pytest.approx(0.004)
    assert model["r2"] == pytest.approx(1.0)
    assert model["at_1000_tasks_m32768_s"] == pytest.approx(0.05 + 2e-5 * 32768 + 4.0, abs=1e-3)


def test_r2_drops_when_the_model_does_not_explain_the_points() -> None:
    model = fit(_points([0.0, 0.3, -0.2, 0.25, -0.3, 0.1]), "driver_s")
    assert 0.0 < model["r2"] < 0.9
    assert model["max_abs_residual_s"] > 0.05


def test_fit_driver_model_fits_both_targets() -> None:
    model = fit_driver_model(_points([0.0] * 6))
    assert model["formula"] == "t = a + b*M + c*p" and model["points"] == 6
    assert model["driver_and_spark_s"]["c_s_per_task"] == pytest.approx(0.01)


def test_driver_point_from_manifest_detail() -> None:
    detail = {
        "process_s": [9.0, 1.0, 1.2, 1.1],
        "tasks_wall_s": [8.0, 0.8, 0.9, 0.85],
        "commit_ms": [50.0, 20.0, 30.0, 40.0],
        "routing": ["split"] * 4,
    }
    point = driver_point(4096, 4, 2, detail, [7.0, 0.3, 0.4, 0.1], 1.3)
    # own: process - tasks wall + commit, median of epochs 2..4: 0.22, 0.33, 0.29
    assert point["driver_s"] == pytest.approx(0.29)
    # spark: tasks wall - 2 waves x task path, clipped: 0.2, 0.1, 0.65 -> sums .42 .43 .94
    assert point["driver_and_spark_s"] == pytest.approx(0.43)
    assert point["task_waves"] == 2 and point["routing"] == "split"
