"""Dashboard actions create the same operations as the REST API, show what they will do first,
refuse bad input in words, and are only for operators (a viewer sees no buttons, gets 403)."""

from __future__ import annotations

import html as htmllib
import re
from collections.abc import Callable

import pytest
from django.test import Client

from controlplane.audit.models import AuditEntry
from controlplane.operations.models import Operation
from tests.web.conftest import Lineage

ClientFor = Callable[[str | None], Client]
JOB_ACTIONS = ("start", "stop", "savepoint", "rescale", "rollback", "migrate")


def text(response: object) -> str:
    return htmllib.unescape(response.content.decode())  # type: ignore[attr-defined]


def key_of(page: str) -> str:
    match = re.search(r'name="idempotency_key" value="([^"]+)"', page)
    assert match is not None
    return match.group(1)


def test_viewer_sees_no_action_buttons_and_gets_403(
    client_for: ClientFor, lineage: Lineage
) -> None:
    viewer = client_for("viewer")
    job_page = viewer.get("/jobs/clicks-main/").content.decode()
    assert 'data-testid="actions"' not in job_page and "/rescale/" not in job_page
    panel = viewer.get(
        f"/applications/clicks/snapshots/{lineage.main[2]}/", HTTP_HX_REQUEST="true"
    ).content.decode()
    assert 'data-testid="snapshot-actions"' not in panel and "Roll back" not in panel
    for kind in JOB_ACTIONS:
        assert viewer.get(f"/jobs/clicks-main/{kind}/").status_code == 403, kind
        refused = viewer.post(f"/jobs/clicks-main/{kind}/", {"parallelism": 3, "to": "x"})
        assert refused.status_code == 403, kind
        assert "needs the operator role" in text(refused)
    assert viewer.get("/applications/clicks/fork/").status_code == 403
    assert viewer.post("/applications/clicks/fork/", {"snapshot": "x"}).status_code == 403
    op = Operation.objects.create(kind="stop", application=lineage.application, job=lineage.job)
    assert viewer.post(f"/operations/{op.pk}/cancel/").status_code == 403
    assert Operation.objects.count() == 1


def test_operator_sees_the_buttons(client_for: ClientFor, lineage: Lineage) -> None:
    operator = client_for("operator")
    page = operator.get("/jobs/clicks-main/").content.decode()
    assert 'data-testid="actions"' in page
    for kind in ("start", "rescale", "savepoint", "migrate"):
        assert f"/jobs/clicks-main/{kind}/" in page
    panel = operator.get(
        f"/applications/clicks/snapshots/{lineage.main[2]}/", HTTP_HX_REQUEST="true"
    ).content.decode()
    assert "Roll back clicks-main here" in panel and "Fork from here" in panel


def test_every_form_carries_a_csrf_token_and_posts_without_one_are_refused(
    users: dict[str, object], lineage: Lineage
) -> None:
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(users["operator"])  # type: ignore[arg-type]
    for url in [f"/jobs/clicks-main/{kind}/" for kind in JOB_ACTIONS] + [
        "/applications/clicks/fork/",
        "/jobs/clicks-main/",
        "/",
    ]:
        page = strict.get(url).content.decode()
        assert page.count("<form") == page.count("csrfmiddlewaretoken") + page.count(
            'method="get"'
        ), url
    refused = strict.post("/jobs/clicks-main/rescale/", {"parallelism": 3})
    assert refused.status_code == 403
    assert Operation.objects.count() == 0


def test_rescale_shows_the_key_group_moves_then_creates_the_operation(
    client_for: ClientFor, lineage: Lineage
) -> None:
    operator = client_for("operator")
    page = text(operator.get("/jobs/clicks-main/rescale/?parallelism=4"))
    assert 'data-testid="rescale-preview"' in page
    # M=8: p=3 owns [0-2] [3-5] [6-7]; p=4 owns [0-1] [2-3] [4-5] [6-7]
    moves = re.findall(
        r"<tr><td>(\d+)\u2013(\d+)</td><td class=\"num\">(\d+)</td><td>(\d+)</td>"
        r"<td>(\d+)</td>",
        page,
    )
    assert moves == [
        ("2", "2", "1", "0", "1"),
        ("4", "5", "2", "1", "2"),
        ("6", "7", "2", "2", "3"),
    ]
    assert "5</strong> of 8 key groups change task" in page
    live_preview = operator.get(
        "/jobs/clicks-main/rescale/?preview=1&parallelism=2", HTTP_HX_REQUEST="true"
    ).content.decode()
    assert live_preview.lstrip().startswith('<div data-testid="rescale-preview"')
    key = key_of(page)
    done = operator.post(
        "/jobs/clicks-main/rescale/",
        {"parallelism": 4, "mode": "restart", "reason": "more load", "idempotency_key": key},
    )
    assert done.status_code == 302
    [op] = Operation.objects.all()
    assert done["Location"] == f"/jobs/clicks-main/?operation={op.pk}"
    assert (op.kind, op.requested_via, op.reason) == ("rescale", "web", "more load")
    assert op.params["parallelism"] == 4 and op.params["from_parallelism"] == 3
    assert op.requested_by.username == "operator"
    entry = AuditEntry.objects.get(action="web rescale")
    assert entry.source == "web" and entry.operation_id == op.pk and entry.status_code == 202
    # the same rendered form submitted twice asks for the same operation
    again = operator.post(
        "/jobs/clicks-main/rescale/", {"parallelism": 4, "mode": "restart", "idempotency_key": key}
    )
    assert again.status_code == 302 and Operation.objects.count() == 1
    # the job page follows it
    job_page = operator.get("/jobs/clicks-main/").content.decode()
    assert 'data-testid="running-operation"' in job_page and "rescale_commit" in job_page


@pytest.mark.parametrize(
    ("data", "words", "status"),
    [
        ({"parallelism": 99, "mode": "auto"}, "exceeds the lineage's max parallelism M=8", 422),
        ({"parallelism": 3, "mode": "auto"}, "already runs at parallelism 3", 409),
        ({"parallelism": "many"}, "Enter a whole number", 400),
        ({"parallelism": 2, "mode": "live"}, "a live rescale needs a running job", 409),
    ],
)
def test_rescale_refuses_bad_input_in_words(
    client_for: ClientFor, lineage: Lineage, data: dict[str, object], words: str, status: int
) -> None:
    response = client_for("operator").post("/jobs/clicks-main/rescale/", data)
    assert response.status_code == status
    assert words in text(response)
    assert Operation.objects.count() == 0


def test_rollback_names_what_it_abandons_then_rolls_back(
    client_for: ClientFor, lineage: Lineage
) -> None:
    operator = client_for("operator")
    target = lineage.main[2]
    page = text(operator.get(f"/jobs/clicks-main/rollback/?to={target}"))
    abandoned = re.search(r'data-testid="abandoned">(.*?)</p>', page, re.S)
    assert abandoned is not None
    words = re.sub(r"<[^>]+>", "", abandoned.group(1))
    assert "This abandons 3 commits — epochs 3 to 5" in words
    assert lineage.main[5][:12] in words and "462 records" in words  # 153 + 154 + 155
    done = operator.post("/jobs/clicks-main/rollback/", {"to": target, "reason": "bad deploy"})
    assert done.status_code == 302
    [op] = Operation.objects.all()
    assert op.kind == "rollback" and op.params["to"] == target


def test_rollback_refuses_a_snapshot_that_is_not_an_earlier_one(
    client_for: ClientFor, lineage: Lineage
) -> None:
    operator = client_for("operator")
    preview = text(operator.get(f"/jobs/clicks-main/rollback/?to={lineage.fork[1]}"))
    assert "is not an earlier snapshot of branch main" in preview and "fork it" in preview
    response = operator.post("/jobs/clicks-main/rollback/", {"to": lineage.main[5]})
    assert response.status_code == 409 and "is the head of main already" in text(response)
    assert operator.post("/jobs/clicks-main/rollback/", {"to": "zz"}).status_code == 422
    assert Operation.objects.count() == 0


def test_a_second_operation_is_refused_naming_the_running_one(
    client_for: ClientFor, lineage: Lineage
) -> None:
    operator = client_for("operator")
    assert operator.post("/jobs/clicks-main/stop/", {}).status_code == 302
    running = Operation.objects.get()
    response = operator.post("/jobs/clicks-main/savepoint/", {})
    assert response.status_code == 409
    assert f"already has a pending stop operation {running.pk}" in text(response)
    entry = AuditEntry.objects.get(action="web savepoint")
    assert entry.outcome == "conflict" and entry.status_code == 409
    cancelled = operator.post(f"/operations/{running.pk}/cancel/")
    assert cancelled.status_code == 302
    running.refresh_from_db()
    assert running.state == "cancelled"
    again = operator.post(f"/operations/{running.pk}/cancel/")
    assert again.status_code == 409 and "nothing to cancel" in text(again)


def test_fork_savepoint_start_and_migrate_create_their_operations(
    client_for: ClientFor, lineage: Lineage
) -> None:
    operator = client_for("operator")
    form = text(
        operator.get(f"/applications/clicks/fork/?snapshot={lineage.main[3]}&job=clicks-main")
    )
    assert f'value="fork-{lineage.main[3][:8]}"' in form
    fork = operator.post(
        "/applications/clicks/fork/",
        {
            "snapshot": lineage.main[3][:16],
            "branch": "try-v2",
            "version": "1",
            "job": "clicks-main",
            "reason": "try v2",
        },
    )
    op = Operation.objects.get(kind="fork")
    assert fork.status_code == 302 and fork["Location"] == f"/operations/{op.pk}/"
    assert op.params["snapshot"] == lineage.main[3] and op.params["version_id"] == (
        lineage.application.versions.get(number=1).pk
    )
    assert "new_version" not in op.params  # an operator's fork runs an existing version
    assert op.context == {"source_job": "clicks-main"}
    taken = operator.post(
        "/applications/clicks/fork/", {"snapshot": lineage.main[3], "branch": "exp"}
    )
    assert taken.status_code == 409 and "exists already; choose another name" in text(taken)

    assert operator.post("/jobs/clicks-main/savepoint/", {"name": "before-v2"}).status_code == 302
    savepoint = Operation.objects.get(kind="savepoint")
    assert savepoint.params["name"] == "before-v2"
    savepoint.state = "succeeded"
    savepoint.save()
    assert operator.post("/jobs/clicks-main/start/", {}).status_code == 302
    start = Operation.objects.get(kind="start")
    start.state = "succeeded"
    start.save()
    bad = operator.post("/jobs/clicks-main/migrate/", {"mode": "rehash"})
    assert bad.status_code == 400 and "max_parallelism is required" in text(bad)
    assert (
        operator.post(
            "/jobs/clicks-main/migrate/", {"mode": "rehash", "max_parallelism": 16}
        ).status_code
        == 302
    )
    assert Operation.objects.get(kind="migrate").params == {"mode": "rehash", "max_parallelism": 16}


def test_operation_page_follows_phases(client_for: ClientFor, lineage: Lineage) -> None:
    operator = client_for("operator")
    operator.post("/jobs/clicks-main/stop/", {"reason": "maintenance"})
    op = Operation.objects.get()
    page = operator.get(f"/operations/{op.pk}/").content.decode()
    assert 'data-testid="operation-state">pending' in page and "maintenance" in page
    assert 'hx-trigger="load, epochal:watch"' in page and "data-watch" in page  # live
    partial = operator.get(f"/operations/{op.pk}/", HTTP_HX_REQUEST="true")
    assert partial.content.decode().lstrip().startswith('<div id="operation-live"')
    # The live part holds its ETag: unchanged -> 304 (after watching), changed -> a fragment.
    etag = partial["ETag"]
    assert etag[1:-1] in partial.content.decode()  # in the element's hx-headers
    url = f"/operations/{op.pk}/?watch=0"
    same = operator.get(url, HTTP_HX_REQUEST="true", HTTP_IF_NONE_MATCH=etag)
    assert same.status_code == 304
    Operation.objects.filter(pk=op.pk).update(progress=0.5)
    moved = operator.get(url, HTTP_HX_REQUEST="true", HTTP_IF_NONE_MATCH=etag)
    assert moved.status_code == 200 and moved["ETag"] != etag
    assert client_for("viewer").get("/operations/not-an-id/").status_code == 404


def test_fork_form_sets_the_operators_spark_resources_checked_as_over_rest(
    client_for: ClientFor, lineage: Lineage
) -> None:
    operator = client_for("operator")
    form = text(operator.get(f"/applications/clicks/fork/?snapshot={lineage.main[3]}"))
    for key in (
        "spark.executor.instances",
        "spark.executor.memory",
        "spark.sql.shuffle.partitions",
    ):
        assert key in form
    base = {"snapshot": lineage.main[3], "branch": "sized", "job_name": "clicks-sized"}
    too_big = operator.post(
        "/applications/clicks/fork/",
        {**base, "spark_executor_memory": "1t", "spark_executor_instances": "300"},
    )
    assert too_big.status_code == 400
    page = text(too_big)
    # each refused key is named on its own field, in the server's words
    assert (
        "spark_conf.spark.executor.memory" in page and "spark_conf.spark.executor.instances" in page
    )
    assert "from 512m to 256g" in page and "from 1 to 256" in page
    assert not Operation.objects.filter(kind="fork").exists()
    refusal = AuditEntry.objects.filter(action="web fork", status_code=400).latest("id")
    assert refusal.detail["fields"] == [
        "spark_conf.spark.executor.instances",
        "spark_conf.spark.executor.memory",
    ]
    sized = operator.post(
        "/applications/clicks/fork/",
        {
            **base,
            "spark_executor_instances": "4",
            "spark_executor_cores": "2",
            "spark_executor_memory": "4g",
            "spark_sql_shuffle_partitions": "64",
        },
    )
    assert sized.status_code == 302
    op = Operation.objects.get(kind="fork")
    assert op.params["spark_conf"] == {
        "spark.executor.instances": "4",
        "spark.executor.cores": "2",
        "spark.executor.memory": "4g",
        "spark.sql.shuffle.partitions": "64",
    }


def test_a_fork_of_a_job_with_a_sink_writes_to_sinks_of_its_own_or_none(
    client_for: ClientFor, lineage: Lineage, settings: object, tmp_path: object
) -> None:
    from controlplane.applications.models import Sink
    from controlplane.applications.services import version_create

    settings.EPOCHAL_SINK_ROOTS = (tmp_path,)  # type: ignore[attr-defined]
    for name in ("lake", "lake2"):
        Sink.objects.create(name=name, kind="delta", config={"path": f"{tmp_path}/{name}"})
    job = lineage.job
    job.version = version_create(
        application=lineage.application, job=job.version.job, config={"sinks": ["lake"]}
    )
    job.save()
    operator = client_for("operator")
    form = text(operator.get(f"/applications/clicks/fork/?snapshot={lineage.main[3]}"))
    assert 'value="lake2"' in form and "instead of the version" in form
    base = {"snapshot": lineage.main[3], "job": job.name, "reason": "try"}
    taken = operator.post("/applications/clicks/fork/", {**base, "branch": "a"})
    assert taken.status_code == 422 and "sink 'lake' is written by job" in text(taken)
    for branch, sinks in (("b", ["lake2"]), ("c", [])):
        done = operator.post(
            "/applications/clicks/fork/",
            {**base, "branch": branch, "own_sinks": "on", "sinks": sinks},
        )
        assert done.status_code == 302, text(done)
        op = Operation.objects.get(kind="fork", params__branch=branch)
        assert op.params["new_version"]["config"].get("sinks", []) == sinks
