"""The operations list (filters by job, kind, state, who asked) and an operation's page: who
asked and how in words, each phase's duration, parameters and results as words (no Python
reprs), and an audit trail that credits the request to the way it came, not to the worker."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable

from django.test import Client
from django.utils import timezone

from controlplane.operations.models import Operation
from controlplane.operations.services import operation_request
from tests.web.conftest import Lineage

ClientFor = Callable[[str | None], Client]


def requested(
    lineage: Lineage, kind: str, via: str, user: object = None, **params: object
) -> Operation:
    return operation_request(
        kind=kind,
        application=lineage.application,
        job=lineage.job,
        params=params,
        user=user,  # type: ignore[arg-type]
        via=via,
        reason=f"{kind} for the test",
        dispatch=False,
    ).operation


def finish(op: Operation, state: str = "succeeded", **result: object) -> None:
    """Record the operation as a worker would have: each phase 1.5 s, then its end."""
    start = timezone.now() - dt.timedelta(seconds=10)
    phases = []
    for i, phase in enumerate(op.phases):
        began = start + dt.timedelta(seconds=1.5 * i)
        phases.append(
            {
                **phase,
                "state": "succeeded",
                "started_at": began.isoformat(),
                "finished_at": (began + dt.timedelta(seconds=1.5)).isoformat(),
                "progress": 1.0,
                "detail": f"{phase['name']} done",
            }
        )
    Operation.objects.filter(pk=op.pk).update(
        state=state,
        phases=phases,
        result=result,
        started_at=start,
        finished_at=start + dt.timedelta(seconds=1.5 * len(phases)),
        progress=1.0,
    )


def listed(html: str) -> list[str]:
    return re.findall(r'data-kind="([a-z]+)"', html)


def test_the_operations_list_filters_by_job_kind_state_and_requester(
    client_for: ClientFor, lineage: Lineage, users: dict[str, object]
) -> None:
    tip = lineage.main[-1]
    savepoint = requested(lineage, "savepoint", "web", users["operator"], snapshot=tip)
    finish(savepoint, tag="sp-1", snapshot=tip)
    stop = requested(lineage, "stop", "cli")
    finish(stop, state="failed")
    client = client_for("viewer")

    everything = client.get("/operations/")
    assert everything.status_code == 200
    assert listed(everything.content.decode()) == ["stop", "savepoint"]  # newest first
    assert listed(client.get("/operations/?kind=savepoint").content.decode()) == ["savepoint"]
    assert listed(client.get("/operations/?state=failed").content.decode()) == ["stop"]
    assert listed(client.get("/operations/?requester=operator").content.decode()) == ["savepoint"]
    assert listed(client.get("/operations/?requester=cli").content.decode()) == ["stop"]
    assert listed(client.get("/operations/?job=clicks-main").content.decode()) == [
        "stop",
        "savepoint",
    ]
    assert listed(client.get("/operations/?job=nope").content.decode()) == []
    bad = client.get("/operations/?kind=explode&state=weird").content.decode()
    assert "is not one of" in bad and listed(bad) == ["stop", "savepoint"]
    assert 'href="/operations/"' in client.get("/").content.decode()  # in the navigation


def test_an_operation_page_says_who_asked_how_long_each_phase_took_in_words(
    client_for: ClientFor, lineage: Lineage, users: dict[str, object]
) -> None:
    tip = lineage.main[-1]
    by_cli = requested(lineage, "savepoint", "cli", snapshot=tip)
    finish(by_cli, tag="sp-2", snapshot=tip, details={"moved": True, "runs": ["a", "b"]})
    html = client_for("viewer").get(f"/operations/{by_cli.pk}/").content.decode()
    asked = re.search(r'data-testid="asked-by">([^<]*)<', html)
    assert asked and "the command line (epochal), with no user named" in asked[1]
    durations = re.findall(r'data-testid="phase-duration">([^<]*)<', html)
    assert durations == ["1.5 s", "1.5 s"]  # await_epoch, tag
    result = html[html.index('data-testid="operation-result"') :]
    assert "moved: yes · runs: a, b" in result  # words, not {'moved': True, …}
    assert "True" not in result and "{&#x27;" not in result
    trail = html[html.index('data-testid="audit-trail"') :]
    assert "<td>cli</td><td>operation.savepoint</td><td>requested</td>" in trail

    by_web = requested(lineage, "savepoint", "web", users["operator"], snapshot=tip)
    html = client_for("viewer").get(f"/operations/{by_web.pk}/").content.decode()
    assert "operator, through the dashboard" in html
