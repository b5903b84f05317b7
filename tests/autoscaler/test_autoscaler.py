"""The autoscaler against a real store and PostgreSQL: policies (REST, strict), decisions
recorded with their inputs once per new epoch, recommend vs apply (an ordinary rescale
operation, audited, refused by the same 409 rule)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from controlplane.applications.models import Application, ApplicationVersion
from controlplane.audit.models import AuditEntry
from controlplane.autoscaler.models import AutoscaleDecision
from controlplane.autoscaler.services import autoscale_all, evaluate, policy_set
from controlplane.jobs.models import Job, JobState
from controlplane.jobs.services import job_create, job_set_state
from controlplane.jobs.store import job_repository
from controlplane.operations.models import Operation
from controlplane.operations.services import operation_request
from snapshots_store import Manifest
from tests.conftest import registered_store

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def job(tmp_path: Path, postgresql_db: None) -> Job:
    app = Application.objects.create(
        name="clicks",
        store_namespace="clicks",
        max_parallelism=8,
        store=registered_store(f"file://{tmp_path / 'store'}"),
    )
    version = ApplicationVersion.objects.create(
        application=app, number=1, job="clickstream", config={}
    )
    job = job_create(name="clicks-main", application=app, version=version, parallelism=2)
    job_set_state(job, JobState.RUNNING)
    return job


def commit(job: Job, loads: list[tuple[int, float, int]], *, p: int = 2) -> str:
    """Append epochs (records, busy seconds, backlog) at parallelism p, 2 s apart."""
    repo = job_repository(job)
    head = repo.read_ref("heads/main")
    parent = None if head is None else head.target
    epoch = 0 if parent is None else repo.read_manifest(parent).epoch
    for records, busy, backlog in loads:
        epoch += 1
        manifest = Manifest(
            branch="main",
            epoch=epoch,
            max_parallelism=8,
            parallelism=p,
            kind="epoch",
            parents=() if parent is None else (parent,),
            created_at=(T0 + timedelta(seconds=2 * epoch)).isoformat().replace("+00:00", "Z"),
            stats={"records_in": records, "busy_s": busy, "backlog_epochs": backlog},
        )
        parent = repo.commit(manifest, "main", expected_head=parent, reason=f"epoch {epoch}")
    assert parent is not None
    return parent


STEADY = [(1000, 2.0, 0)] * 6
STEP = [(2000, 4.0, 1), (2000, 4.0, 2), (2000, 4.0, 3)]


def test_recommend_mode_records_the_decision_with_its_inputs_once_per_epoch(job: Job) -> None:
    policy_set(job=job, changes={"mode": "recommend"})
    commit(job, STEADY)
    first = evaluate(job)
    assert first is not None and first.action == "hold" and first.outcome == "held"
    assert evaluate(job) is None  # nothing committed since: no new decision
    head = commit(job, STEP)
    decision = evaluate(job)
    assert decision is not None
    assert (decision.action, decision.outcome, decision.operation) == (
        "scale_up",
        "recommended",
        None,
    )
    assert decision.current_parallelism == 2
    assert 2 < decision.recommended_parallelism <= 8  # never past the key groups
    assert decision.epoch == 9
    assert decision.inputs["head"] == head
    assert decision.inputs["key_groups"] == 8
    assert decision.inputs["policy"]["mode"] == "recommend"
    assert decision.inputs["estimates"][-1]["backlog_epochs"] == 3
    assert "backlog 3 epochs" in decision.reason
    assert not Operation.objects.filter(job=job).exists()


def test_apply_mode_requests_an_ordinary_audited_rescale(job: Job) -> None:
    policy_set(job=job, changes={"mode": "apply", "max_parallelism": 5})
    commit(job, STEADY + STEP)
    decision = evaluate(job)
    assert decision is not None and decision.outcome == "requested", decision.outcome_detail
    op = decision.operation
    assert op is not None
    assert (op.kind, op.params["parallelism"], op.requested_via) == ("rescale", 5, "autoscaler")
    assert op.reason.startswith("autoscaler: ")
    assert AuditEntry.objects.filter(operation=op, action="operation.rescale").exists()


def test_apply_mode_meets_the_same_409_rule_and_records_the_refusal(job: Job) -> None:
    policy_set(job=job, changes={"mode": "apply"})
    commit(job, STEADY + STEP)
    running = operation_request(
        kind="savepoint", application=job.application, job=job, params={}, dispatch=False
    ).operation
    decision = evaluate(job)
    assert decision is not None and decision.outcome == "refused"
    assert str(running.pk) in decision.outcome_detail
    assert Operation.objects.filter(job=job).count() == 1


def test_the_beat_task_evaluates_running_jobs_with_a_policy_only(job: Job) -> None:
    commit(job, STEADY + STEP)
    assert autoscale_all()["evaluated"] == 0  # no policy: off
    policy_set(job=job, changes={"mode": "recommend"})
    job_set_state(job, JobState.STOPPED)
    assert autoscale_all()["evaluated"] == 0
    job_set_state(job, JobState.RUNNING)
    assert autoscale_all() == {"evaluated": 1, "decided": 1, "requested": 0, "errors": 0}
    assert AutoscaleDecision.objects.filter(job=job).count() == 1


@pytest.fixture
def api(job: Job) -> Callable[[str], APIClient]:
    from controlplane.accounts.services import user_create, user_token

    tokens = {
        role: user_token(user=user_create(username=role, role=role, password="pw-" + role * 3))
        for role in ("viewer", "operator")
    }

    def client(role: str) -> APIClient:
        c = APIClient()
        c.default_format = "json"
        c.credentials(HTTP_AUTHORIZATION=f"Token {tokens[role]}")
        return c

    return client


URL = "/api/jobs/clicks-main/autoscaler/"


def test_rest_policy_is_strict_and_decisions_are_visible(
    job: Job, api: Callable[[str], APIClient]
) -> None:
    bad: list[tuple[dict[str, Any], str]] = [
        ({"mode": "sometimes"}, "mode"),
        ({"min_parallelism": "2"}, "min_parallelism"),  # no coercion
        ({"max_parallelism": True}, "max_parallelism"),
        ({"target_utilisation": 1.5}, "target_utilisation"),
        ({"min_parallelism": 4, "max_parallelism": 3}, "max_parallelism"),
        ({"scale_up": 1}, "scale_up"),
        ({"min_dwell_s": "10"}, "min_dwell_s"),
        ({"min_dwell_s": -1}, "min_dwell_s"),
        ({"utilisation_max": 0.5}, "utilisation_max"),  # below the target
        ({"utilisation_min": 0.7}, "utilisation_min"),  # not below the target
    ]
    for body, field in bad:
        response = api("operator").patch(URL, body)
        assert response.status_code == 400, (body, response.content)
        assert field in response.json()["error"]["fields"], response.json()
    assert api("operator").patch(URL, [1, 2]).status_code == 400
    assert api("viewer").patch(URL, {"mode": "apply"}).status_code == 403
    assert api("viewer").get(URL).json()["policy"]["mode"] == "off"
    ok = api("operator").patch(
        URL,
        {"mode": "recommend", "target_utilisation": 0.6, "utilisation_min": 0.3, "min_dwell_s": 30},
    )
    assert ok.status_code == 200, ok.content
    policy = ok.json()["policy"]
    assert policy["target_utilisation"] == 0.6
    assert (policy["utilisation_min"], policy["utilisation_max"]) == (0.3, 0.9)
    assert policy["min_dwell_s"] == 30.0
    commit(job, STEADY + STEP)
    evaluate(job)
    body = api("viewer").get(URL + "?limit=5").json()
    assert body["decisions"][0]["action"] == "scale_up"
    assert body["decisions"][0]["inputs"]["estimates"]
    assert api("viewer").get(URL + "?limit=x").status_code == 400
    assert api("viewer").get(URL + "?other=1").status_code == 400
    assert api("viewer").get("/api/jobs/nope/autoscaler/").status_code == 404


def test_job_page_shows_the_recommendation_and_why(job: Job) -> None:
    import html

    from django.test import Client

    from controlplane.accounts.services import user_create

    client = Client()
    client.force_login(user_create(username="viewer", role="viewer", password="pw-viewer" * 3))
    page = client.get("/jobs/clicks-main/").content.decode()
    assert 'data-testid="autoscaler" data-mode="off"' in page
    assert "autoscale-decision" not in page
    policy_set(job=job, changes={"mode": "recommend"})
    commit(job, STEADY + STEP)
    decision = evaluate(job)
    assert decision is not None
    page = html.unescape(client.get("/jobs/clicks-main/").content.decode())
    assert 'data-action="scale_up"' in page
    assert f"Recommends parallelism <strong>{decision.recommended_parallelism}</strong>" in page
    assert f"Why: {decision.reason}" in page
    live = client.get("/jobs/clicks-main/live/")
    assert 'id="job-autoscaler" hx-swap-oob="true"' in live.content.decode()
    unchanged = client.get("/jobs/clicks-main/live/", HTTP_IF_NONE_MATCH=live["ETag"])
    assert unchanged.status_code == 304
    # a new decision is a change of the job: the live parts' ETag moves
    commit(job, [(2000, 4.0, 4)])
    assert evaluate(job) is not None
    again = client.get("/jobs/clicks-main/live/", HTTP_IF_NONE_MATCH=live["ETag"])
    assert again.status_code == 200 and again["ETag"] != live["ETag"]


def test_the_dwell_time_reaches_back_past_the_decision_window(job: Job) -> None:
    # a change to p=4, then 20 quiet epochs (2 s apart): more than one decision reads
    # (sample_limit: 13 commits), so the change is found only by reading back for the dwell
    commit(job, STEADY)
    commit(job, [(500, 0.25, 0)] * 20, p=4)  # utilisation 0.03: wants fewer tasks
    policy_set(job=job, changes={"mode": "recommend", "min_dwell_s": 100})
    held = evaluate(job)
    assert held is not None and held.action == "hold", held.reason if held else None
    assert "min_dwell_s" in held.reason and held.recommended_parallelism < 4
    policy_set(job=job, changes={"min_dwell_s": 30})
    free = evaluate(job, force=True)
    assert free is not None and free.action == "scale_down", free.reason
