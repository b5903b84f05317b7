"""The job file over REST: export, diff and apply, checked whole before any side effect
(400 naming ``jobs[i].field``, 422 for what is not registered), with the roles of the
requests it makes; applying requests the ordinary operations (audited, once)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from controlplane.audit.models import AuditEntry
from controlplane.autoscaler.models import AutoscalePolicy
from controlplane.jobs.models import Job
from controlplane.operations.models import Operation
from tests.api.conftest import Lineage

pytestmark = pytest.mark.django_db

Client = Callable[[str | None], APIClient]


def _exported(client_for: Client) -> dict[str, Any]:
    response = client_for("viewer").get("/api/job-file/")
    assert response.status_code == 200, response.content
    return dict(response.json())


def test_export_is_the_jobs_and_its_own_diff_is_empty(lineage: Lineage, client_for: Client) -> None:
    document = _exported(client_for)
    assert document["apiVersion"] == "epochal.io/v1" and document["kind"] == "JobList"
    [entry] = document["jobs"]
    assert entry == {
        "name": "clicks-main",
        "application": "clicks",
        "store": "",
        "version": 1,
        "job": lineage.version.job,
        "branch": "main",
        "parallelism": 2,
        "state": "stopped",
        "upgrade": "fork",
        "resources": {},
        "autoscaler": None,
    }
    diff = client_for("viewer").post("/api/job-file/diff/", document, format="json")
    assert diff.status_code == 200 and diff.json() == {"changes": []}


MALFORMED: list[tuple[Callable[[dict[str, Any]], Any], str]] = [
    (lambda d: d["jobs"][0].update(parallelism=0), "jobs[0].parallelism"),
    (lambda d: d["jobs"][0].update(parallelism="3"), "jobs[0].parallelism"),
    (lambda d: d["jobs"][0].update(replicas=3), "jobs[0].replicas"),
    (lambda d: d["jobs"][0].pop("branch"), "jobs[0].branch"),
    (lambda d: d["jobs"][0].update(upgrade="in-place"), "jobs[0].upgrade"),
    (
        lambda d: d["jobs"][0].update(resources={"spark.jars": "x"}),
        "jobs[0].resources.spark.jars",
    ),
    (lambda d: d.update(apiVersion="v0"), "apiVersion"),
    (lambda d: d["jobs"][0].update(autoscaler={"mode": "sometimes"}), "jobs[0].autoscaler"),
]


def test_a_malformed_file_is_a_400_naming_the_field_and_changes_nothing(
    lineage: Lineage, client_for: Client
) -> None:
    exported = _exported(client_for)
    for edit, field in MALFORMED:
        document = copy.deepcopy(exported)
        document["jobs"][0]["parallelism"] = 3  # a change the file would make if it were valid
        edit(document)
        for path in ("/api/job-file/diff/", "/api/job-file/apply/"):
            response = client_for("operator").post(path, document, format="json")
            assert response.status_code == 400, (field, response.content)
            assert field in response.json()["error"]["fields"], response.json()
    assert not Operation.objects.exists()
    assert Job.objects.get(name="clicks-main").parallelism == 2


UNUSABLE: list[tuple[str, Any, str]] = [
    ("application", "nope", "no registered application"),
    ("version", 9, "has no version 9"),
    ("job", "another-job", "runs registered job"),
    ("store", "elsewhere", "moving it is a migrate operation"),
    ("branch", "exp", "never change"),
    ("resources", {"spark.executor.memory": "2g"}, "change with a fork"),
    ("autoscaler", {"min_parallelism": 9, "max_parallelism": 4}, "do not fit together"),
    ("parallelism", 9, "at most the application's max parallelism M=8"),
]


def test_what_is_not_registered_or_cannot_change_is_a_422(
    lineage: Lineage, client_for: Client
) -> None:
    exported = _exported(client_for)
    for name, value, says in UNUSABLE:
        document = copy.deepcopy(exported)
        document["jobs"][0].update({"parallelism": 3, name: value})
        response = client_for("operator").post("/api/job-file/apply/", document, format="json")
        assert response.status_code == 422, (name, response.content)
        assert says in response.json()["error"]["message"]
        fields = list(response.json()["error"]["fields"])
        assert fields and all(f.startswith(f"jobs[0].{name}") for f in fields), fields
    twice = copy.deepcopy(exported)
    twice["jobs"].append({**twice["jobs"][0], "branch": "exp"})
    response = client_for("operator").post("/api/job-file/apply/", twice, format="json")
    assert response.status_code == 422 and "jobs[1].name" in response.json()["error"]["fields"]
    assert not Operation.objects.exists()


def test_apply_needs_an_operator_diff_a_viewer(lineage: Lineage, client_for: Client) -> None:
    document = _exported(client_for)
    document["jobs"][0]["parallelism"] = 3
    assert client_for(None).post("/api/job-file/diff/", document, format="json").status_code == 401
    refused = client_for("viewer").post("/api/job-file/apply/", document, format="json")
    assert refused.status_code == 403
    assert not Operation.objects.exists()


def test_apply_requests_the_operations_once_and_sets_the_policy(
    lineage: Lineage, client_for: Client
) -> None:
    document = copy.deepcopy(_exported(client_for))
    entry = document["jobs"][0]
    entry["parallelism"] = 4
    entry["autoscaler"] = {"mode": "recommend", "min_parallelism": 2, "max_parallelism": 6}
    new = {**entry, "name": "clicks-exp", "branch": "exp", "parallelism": 1, "autoscaler": None}
    taken = copy.deepcopy(document)
    taken["jobs"].append({**new, "branch": "main"})  # main has clicks-main: one job per branch
    refused = client_for("operator").post("/api/job-file/apply/", taken, format="json")
    assert refused.status_code == 422 and "jobs[1].branch" in refused.json()["error"]["fields"]
    assert not Operation.objects.exists() and not AutoscalePolicy.objects.exists()
    document["jobs"].append(new)

    diff = client_for("viewer").post("/api/job-file/diff/", document, format="json").json()
    assert [(c["job"], c["field"], c["request"]) for c in diff["changes"]] == [
        ("clicks-main", "autoscaler", "autoscaler"),
        ("clicks-main", "parallelism", "rescale"),
        ("clicks-exp", "job", "create"),
    ]
    assert not Job.objects.filter(name="clicks-exp").exists()  # a diff changes nothing

    operator = client_for("operator")
    first = operator.post("/api/job-file/apply/", document, format="json")
    assert first.status_code == 200, first.content
    outcomes = {(o["job"], o["request"]): o for o in first.json()["outcomes"]}
    rescale = outcomes[("clicks-main", "rescale")]
    assert rescale["outcome"] == "requested"
    operation = Operation.objects.get(pk=rescale["operation"])
    assert operation.kind == "rescale" and operation.params["parallelism"] == 4
    assert operation.requested_by.username == "operator" and operation.requested_via == "api"
    assert AuditEntry.objects.filter(action="operation.rescale", outcome="requested").exists()
    policy = AutoscalePolicy.objects.get(job__name="clicks-main")
    assert (policy.mode, policy.min_parallelism, policy.max_parallelism) == ("recommend", 2, 6)
    created = Job.objects.get(name="clicks-exp")
    assert (created.branch, created.parallelism, created.desired_state) == ("exp", 1, "stopped")

    again = operator.post("/api/job-file/apply/", document, format="json").json()["outcomes"]
    assert [(o["request"], o["outcome"], o["operation"]) for o in again] == [
        ("rescale", "already requested", str(operation.pk))
    ]
    assert Operation.objects.count() == 1


def test_a_new_version_is_rolled_out_by_a_fork_then_a_hotswap(
    lineage: Lineage, client_for: Client
) -> None:
    from controlplane.applications.services import version_create

    v2 = version_create(application=lineage.application, job=lineage.version.job, code_version="v2")
    document = copy.deepcopy(_exported(client_for))
    document["jobs"][0].update(version=2, upgrade="hotswap")
    diff = client_for("viewer").post("/api/job-file/diff/", document, format="json").json()
    assert diff["changes"] == [
        {
            "job": "clicks-main",
            "field": "version",
            "current": 1,
            "wanted": 2,
            "request": "fork",
            "params": {
                "snapshot": "main",
                "branch": "main-v2",
                "job_name": "clicks-main-v2",
                "version": 2,
                "parallelism": 2,
                "start": True,
            },
        }
    ]
    [outcome] = (
        client_for("operator")
        .post("/api/job-file/apply/", document, format="json")
        .json()["outcomes"]
    )
    assert (outcome["request"], outcome["outcome"]) == ("fork", "requested"), outcome
    fork = Operation.objects.get(pk=outcome["operation"])
    assert (fork.kind, fork.params["version_id"], fork.target_branch) == ("fork", v2.pk, "main-v2")
    again = client_for("operator").post("/api/job-file/apply/", document, format="json").json()
    assert [o["outcome"] for o in again["outcomes"]] == ["already requested"]
    # once the fork's job runs (and the old one), the same file asks for the hotswap
    old = Job.objects.get(name="clicks-main")
    Job.objects.filter(pk=old.pk).update(desired_state="running")
    fork.state = "succeeded"
    fork.save(update_fields=["state"])
    Job.objects.create(
        name="clicks-main-v2",
        application=old.application,
        version=old.application.versions.get(number=2),
        branch="main-v2",
        state="running",
        desired_state="running",
    )
    diff = client_for("viewer").post("/api/job-file/diff/", document, format="json").json()
    assert [(c["request"], c["params"]) for c in diff["changes"]] == [
        ("hotswap", {"new_job": "clicks-main-v2"})
    ]
