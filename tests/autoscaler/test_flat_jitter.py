"""The adversarial case on the real engine (Spark local mode): a flat load whose per-record
cost jitters by +-30 % at random (a seeded generator draws each input file's cost factor, so
whole epochs are cheap or dear) never makes the autoscaler change the parallelism more than
once — in apply mode (the decision written to the control document as a live rescale does,
the engine switching at the next epoch) and in recommend mode (decisions recorded in the
database by `services.evaluate` after every commit).

The policy is the default but for a 10 s dwell time (the default 60 s would outlast the test
and hold any second change by itself): the hold band and the bounds must keep it still."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from bench.autoscale import Setup, run
from controlplane.autoscaler.decision import Policy

pytestmark = pytest.mark.spark

EPOCHS = 16
# one file every 3 s of 600 records at 5 ms each: 3 busy seconds per 6 task-seconds at
# p = 2 (utilisation 0.5, 0.35 to 0.65 with the jitter), inside the hold band
FLAT = Setup(
    tick_s=3.0,
    low=600,
    low_ticks=EPOCHS,
    high_ticks=0,
    tail_ticks=0,
    cost_ms=5.0,
    keys=50,
    start_parallelism=2,
    sweep=(2,),
    sweep_ticks=0,
    sweep_repeats=0,
)
JITTER = 0.3


@pytest.fixture(scope="module")
def warm(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The shared session with its Python workers started: a cold first epoch takes several
    ticks and would open the flat load with a backlog."""
    run(
        spark,
        tmp_path_factory.mktemp("warm"),
        "warm",
        [60, 60],
        FLAT,
        parallelism=2,
        realtime=False,
    )
    return spark


def _changes(values: list[int]) -> int:
    return sum(1 for a, b in itertools.pairwise(values) if a != b)


def test_apply_mode_changes_parallelism_at_most_once(warm: Any, tmp_path: Path) -> None:
    policy = Policy(mode="apply", min_dwell_s=10)
    done = run(
        warm,
        tmp_path,
        "flat-apply",
        FLAT.loads,
        FLAT,
        parallelism=2,
        policy=policy,
        jitter=JITTER,
        seed=34,
    )
    assert not done.timed_out and len(done.rows) == EPOCHS
    busy = sorted(r.busy_s for r in done.rows)
    assert busy[-1] / busy[0] > 1.25, busy  # the jitter reached the engine's busy time
    series = [(r.epoch, r.parallelism, r.action, r.recommended) for r in done.rows]
    assert _changes([r.parallelism for r in done.rows]) <= 1, series


@pytest.mark.django_db(transaction=True)
def test_recommend_mode_recommends_at_most_one_change(
    warm: Any, tmp_path: Path, postgresql_db: None
) -> None:
    from controlplane.applications.models import Application, ApplicationVersion
    from controlplane.autoscaler.models import AutoscaleDecision
    from controlplane.autoscaler.services import evaluate, policy_set
    from controlplane.jobs.models import JobState
    from controlplane.jobs.services import job_create, job_set_state
    from controlplane.jobs.store import job_repository
    from tests.conftest import registered_store

    app = Application.objects.create(
        name="flat",
        store_namespace="flat",
        max_parallelism=128,
        store=registered_store(f"file://{tmp_path / 'store'}"),
    )
    version = ApplicationVersion.objects.create(
        application=app, number=1, job="clickstream", config={}
    )
    job = job_create(name="flat-main", application=app, version=version, parallelism=2)
    job_set_state(job, JobState.RUNNING)
    policy_set(job=job, changes={"mode": "recommend", "min_dwell_s": 10})
    done = run(
        warm,
        tmp_path,
        "flat-recommend",
        FLAT.loads,
        FLAT,
        parallelism=2,
        jitter=JITTER,
        seed=35,
        repo=job_repository(job),
        on_commit=lambda result: evaluate(job),
    )
    assert not done.timed_out and len(done.rows) == EPOCHS
    assert {r.parallelism for r in done.rows} == {2}  # recommend mode changes nothing
    decisions = list(AutoscaleDecision.objects.filter(job=job).order_by("created_at", "id"))
    assert len(decisions) == EPOCHS, [d.epoch for d in decisions]  # one per commit
    assert all(d.outcome in ("held", "recommended") and d.operation is None for d in decisions)
    # the parallelism each decision would leave the job at
    wanted = [d.recommended_parallelism if d.action != "hold" else 2 for d in decisions]
    detail = [(d.epoch, d.action, d.recommended_parallelism, d.reason) for d in decisions]
    assert _changes(wanted) <= 1, detail
