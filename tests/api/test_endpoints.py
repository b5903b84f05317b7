"""Each endpoint answers what its selector or service says, in the documented shapes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rest_framework.test import APIClient

from controlplane.audit.models import AuditEntry
from controlplane.audit.rejections import UNAUTHENTICATED, rejection_totals
from controlplane.operations.models import Operation
from tests.api.conftest import Lineage

Client = Callable[[str | None], APIClient]


def _all_pages(client: APIClient, url: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    while url:
        response = client.get(url)
        assert response.status_code == 200, response.content
        body = response.json()
        items += body["results"]
        url = body["next"]
    return items


def test_applications_and_versions_are_listed_created_and_fetched(
    lineage: Lineage, client_for: Client
) -> None:
    admin = client_for("admin")
    created = admin.post("/api/applications/", {"name": "orders", "max_parallelism": 16})
    assert created.status_code == 201
    assert created["Location"].endswith("/api/applications/orders/")
    names = [a["name"] for a in _all_pages(admin, "/api/applications/?limit=1")]
    assert names == ["clicks", "orders"]

    version = admin.post(
        "/api/applications/orders/versions/",
        {"job": "fraud", "code_version": "abc", "config": {"max_epochs": 3}},
    )
    assert version.status_code == 201, version.content
    assert version.json()["number"] == 1
    again = admin.post("/api/applications/orders/versions/", {"job": "fraud"})
    assert again.json()["number"] == 2
    got = admin.get("/api/applications/orders/versions/1/").json()
    assert got["config"] == {"max_epochs": 3} and got["created_by"] == "admin"

    bad_config = admin.post(
        "/api/applications/orders/versions/", {"job": "fraud", "config": {"nope": 1}}
    )
    assert bad_config.status_code == 400
    assert "config" in bad_config.json()["error"]["fields"]
    for job in ("runners.jobs.fraud:job", "not-installed"):  # code only from entry points
        refused = admin.post("/api/applications/orders/versions/", {"job": job})
        assert refused.status_code == 400, refused.content
        assert "job" in refused.json()["error"]["fields"]
    assert len(admin.get("/api/applications/orders/versions/").json()["results"]) == 2
    duplicate = admin.post("/api/applications/", {"name": "orders"})
    assert duplicate.status_code == 409  # taken: a conflict, as under a race
    assert "name" in duplicate.json()["error"]["fields"]


def test_job_create_and_detail_show_run_active_operation_and_head(
    lineage: Lineage, client_for: Client
) -> None:
    operator = client_for("operator")
    created = operator.post(
        "/api/jobs/", {"name": "clicks-exp", "application": "clicks", "branch": "exp"}
    )
    assert created.status_code == 201, created.content
    assert created.json()["version"] == 1
    clash = operator.post("/api/jobs/", {"name": "other", "application": "clicks"})
    assert clash.status_code == 409
    assert clash.json()["error"]["code"] == "job_exists"

    detail = operator.get("/api/jobs/clicks-exp/").json()
    assert detail["head"]["snapshot_id"] == lineage.fork[-1]
    assert detail["current_run"] is None and detail["active_operation"] is None

    accepted = operator.post("/api/jobs/clicks-exp/operations/", {"kind": "stop"})
    assert accepted.status_code == 202
    detail = operator.get("/api/jobs/clicks-exp/").json()
    assert detail["active_operation"]["id"] == accepted.json()["id"]

    by_state = operator.get("/api/jobs/?state=created&application=clicks").json()
    assert [j["name"] for j in by_state["results"]] == ["clicks-exp", "clicks-main"]
    assert operator.get("/api/jobs/?state=bogus").status_code == 400
    assert operator.get("/api/jobs/clicks-main/runs/").json()["results"] == []
    logs = operator.get("/api/jobs/clicks-main/logs/?tail=10").json()
    assert logs == {"run_id": None, "tail": 10, "text": ""}


def test_snapshot_log_pages_follow_the_branch_history(lineage: Lineage, client_for: Client) -> None:
    viewer = client_for("viewer")
    main = _all_pages(viewer, "/api/applications/clicks/snapshots/?rev=main&limit=2")
    assert [s["snapshot_id"] for s in main] == lineage.main[::-1]
    exp = _all_pages(viewer, "/api/applications/clicks/snapshots/?rev=exp&first_parent=true")
    assert [s["snapshot_id"] for s in exp] == [*lineage.fork[::-1], *lineage.main[1::-1]]
    tagged = viewer.get("/api/applications/clicks/snapshots/?rev=tags/sp-1&limit=1").json()
    assert tagged["results"][0]["snapshot_id"] == lineage.main[2]


def test_snapshot_detail_has_manifest_fields_provenance_and_diff(
    lineage: Lineage, client_for: Client
) -> None:
    viewer = client_for("viewer")
    fork = viewer.get(f"/api/applications/clicks/snapshots/{lineage.fork[0]}/").json()
    assert fork["kind"] == "fork"
    assert fork["provenance"]["source_snapshot"] == lineage.main[1]
    assert fork["parents"] == [lineage.main[1]]
    assert fork["offsets"] == {"clicks": {"0": 200, "1": 100}}
    assert fork["manifest"]["key_groups"] == 3

    diff = viewer.get(f"/api/applications/clicks/snapshots/{lineage.main[3]}/diff/").json()
    assert diff["old"] == lineage.main[2] and diff["new"] == lineage.main[3]
    assert [c["key_group"] for c in diff["added"]] == [3]
    assert {o["partition"]: o["advanced"] for o in diff["offsets"]} == {"0": 100, "1": 50}
    against = viewer.get(
        f"/api/applications/clicks/snapshots/{lineage.main[4]}/diff/?against={lineage.main[0]}"
    ).json()
    assert against["old"] == lineage.main[0]
    assert [c["key_group"] for c in against["added"]] == [1, 2, 3]
    assert [c["key_group"] for c in against["changed"]] == [0]
    root = viewer.get(f"/api/applications/clicks/snapshots/{lineage.main[0]}/diff/")
    assert root.status_code == 400 and root.json()["error"]["code"] == "no_parent"
    relative = viewer.get(
        f"/api/applications/clicks/snapshots/{lineage.main[4]}/diff/?against=main~3"
    ).json()
    assert relative["old"] == lineage.main[1]
    malformed = viewer.get(
        f"/api/applications/clicks/snapshots/{lineage.main[4]}/diff/?against=a..b"
    )
    assert malformed.status_code == 400
    assert malformed.json()["error"]["fields"] == {"against": ["not a revision"]}
    newline = viewer.get(
        f"/api/applications/clicks/snapshots/{lineage.main[4]}/diff/?against=main%0A"
    )
    assert newline.status_code == 400 and "against" in newline.json()["error"]["fields"]
    unknown = viewer.get(f"/api/applications/clicks/snapshots/{lineage.main[4]}/diff/?against=nope")
    assert unknown.status_code == 404


def test_branches_tags_and_graph_pages(lineage: Lineage, client_for: Client) -> None:
    viewer = client_for("viewer")
    branches = viewer.get("/api/applications/clicks/branches/").json()["results"]
    assert {b["name"]: b["head"] for b in branches} == {
        "main": lineage.main[-1],
        "exp": lineage.fork[-1],
    }
    assert _all_pages(viewer, "/api/applications/clicks/branches/?limit=1")[1]["name"] == "main"
    tags = viewer.get("/api/applications/clicks/tags/").json()["results"]
    assert tags == [{"name": "sp-1", "target": lineage.main[2], "target_epoch": 2, "reflog_seq": 1}]

    first = viewer.get("/api/applications/clicks/lineage/?limit=4").json()
    assert len(first["results"]) == 4 and first["next"]
    refs = first["refs"]
    assert refs[lineage.fork[-1]] == ["heads/exp"]
    rest = viewer.get(first["next"]).json()
    ids = [s["snapshot_id"] for s in first["results"] + rest["results"]]
    assert sorted(ids) == sorted(lineage.main + lineage.fork)
    assert rest["next"] is None
    edges = {(e["child"], e["parent"]) for e in first["edges"] + rest["edges"]}
    assert (lineage.fork[0], lineage.main[1]) in edges


def test_operations_are_listed_filtered_fetched_and_cancelled(
    lineage: Lineage, client_for: Client
) -> None:
    operator = client_for("operator")
    op = operator.post("/api/jobs/clicks-main/operations/", {"kind": "stop", "reason": "maint"})
    assert op.status_code == 202
    url = op.json()["url"]
    assert op["Location"] == url
    assert operator.get(url).json()["reason"] == "maint"
    listed = operator.get("/api/operations/?job=clicks-main&kind=stop&state=pending").json()
    assert [o["id"] for o in listed["results"]] == [op.json()["id"]]
    assert operator.get("/api/operations/?state=nope").status_code == 400

    cancelled = operator.post(f"{url}cancel/")
    assert cancelled.status_code == 200
    assert cancelled.json()["state"] == "cancelled"
    again = operator.post(f"{url}cancel/")
    assert again.status_code == 409 and again.json()["error"]["code"] == "operation_ended"


def test_fork_is_requested_on_the_application(lineage: Lineage, client_for: Client) -> None:
    operator = client_for("operator")
    response = operator.post(
        "/api/applications/clicks/operations/",
        {"kind": "fork", "params": {"snapshot": lineage.main[3], "branch": "b2"}, "reason": "ab"},
    )
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["kind"] == "fork" and body["job"] is None
    assert body["params"]["snapshot"] == lineage.main[3]
    unknown = operator.post(
        "/api/applications/clicks/operations/",
        {"kind": "fork", "params": {"snapshot": "nope", "branch": "b3"}},
    )
    assert unknown.status_code == 422  # well-formed, but names no snapshot of the lineage
    assert "snapshot" in unknown.json()["error"]["fields"]


def test_mutations_and_refusals_are_audited_reads_are_not(
    lineage: Lineage, client_for: Client, settings: Any
) -> None:
    AuditEntry.objects.all().delete()
    anonymous_before = rejection_totals()[UNAUTHENTICATED]
    client_for("viewer").get("/api/jobs/")
    client_for(None).get("/api/jobs/")
    client_for("viewer").post("/api/jobs/clicks-main/operations/", {"kind": "stop"})
    op = client_for("operator").post("/api/jobs/clicks-main/operations/", {"kind": "stop"})
    entries = list(AuditEntry.objects.filter(kind="request").order_by("id"))
    # The anonymous refusal is counted, not a row (anyone could flood the log with those).
    assert rejection_totals()[UNAUTHENTICATED] == anonymous_before + 1
    assert [(e.actor_name, e.status_code, e.outcome) for e in entries] == [
        ("viewer", 403, "forbidden"),
        ("operator", 202, "accepted"),
    ]
    assert entries[-1].action == "POST /api/jobs/{name}/operations/"
    assert entries[-1].target == "/api/jobs/clicks-main/operations/"
    assert str(entries[-1].operation_id) == op.json()["id"]

    by_actor = client_for("admin").get("/api/audit/?actor=viewer").json()["results"]
    assert [e["status_code"] for e in by_actor] == [403]
    by_operation = client_for("admin").get(f"/api/audit/?operation={op.json()['id']}").json()
    assert {e["kind"] for e in by_operation["results"]} == {"request", "execution"}
    prefix = client_for("admin").get("/api/audit/?action=POST%20/api/jobs").json()["results"]
    assert len(prefix) == 2
    future = client_for("admin").get("/api/audit/?since=2999-01-01").json()["results"]
    assert future == []
    assert client_for("admin").get("/api/audit/?since=yesterday").status_code == 400

    settings.EPOCHAL_AUDIT_READS = True
    client_for("viewer").get("/api/operations/")
    assert AuditEntry.objects.filter(action="GET /api/operations/", actor_name="viewer").exists()


def test_admins_manage_users_and_roles(lineage: Lineage, client_for: Client) -> None:
    admin = client_for("admin")
    created = admin.post("/api/users/", {"username": "ana", "role": "viewer"})
    assert created.status_code == 201 and created.json()["role"] == "viewer"
    promoted = admin.patch("/api/users/ana/", {"role": "operator"})
    assert promoted.json()["role"] == "operator"
    assert admin.post("/api/users/", {"username": "ana", "role": "viewer"}).status_code == 409
    assert admin.post("/api/users/", {"username": "bo", "role": "king"}).status_code == 400
    users = [u["username"] for u in _all_pages(admin, "/api/users/?limit=2")]
    assert users == ["admin", "ana", "operator", "viewer"]
    assert client_for("operator").get("/api/users/").status_code == 403
    assert Operation.objects.count() == 0
