"""Every dashboard page renders what the control plane holds, for a viewer, with the Django
test client; bad input ends in words a user can act on."""

from __future__ import annotations

import html as htmllib
import json
import re
from collections.abc import Callable

from django.test import Client

from tests.web.conftest import Lineage

ClientFor = Callable[[str | None], Client]


def text(response: object) -> str:
    """The response body as text, HTML entities decoded."""
    return htmllib.unescape(response.content.decode())  # type: ignore[attr-defined]


def test_every_page_needs_a_login(client_for: ClientFor, lineage: Lineage) -> None:
    anonymous = client_for(None)
    for url in (
        "/",
        "/jobs/clicks-main/",
        "/jobs/clicks-main/live/",
        "/applications/clicks/lineage/",
        "/applications/clicks/",
        "/applications/clicks/versions/1/",
        "/audit/",
        "/jobs/clicks-main/rescale/",
    ):
        response = anonymous.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/login/?next="), url


def test_login_page_signs_in_and_out(users: dict[str, object], lineage: Lineage) -> None:
    client = Client()
    page = client.get("/login/")
    assert page.status_code == 200 and b"csrfmiddlewaretoken" in page.content
    wrong = client.post("/login/", {"username": "viewer", "password": "nope"})
    assert wrong.status_code == 200 and b"did not match" in wrong.content
    ok = client.post("/login/", {"username": "viewer", "password": "pw-dashboard-1"})
    assert ok.status_code == 302 and ok["Location"] == "/"
    assert client.get("/").status_code == 200
    out = client.post("/logout/")
    assert out.status_code == 302 and out["Location"] == "/login/"
    assert client.get("/").status_code == 302


def test_overview_lists_jobs_with_head_epoch_parallelism_and_lag(
    client_for: ClientFor, lineage: Lineage
) -> None:
    page = client_for("viewer").get("/")
    assert page.status_code == 200
    html = page.content.decode()
    row = re.search(r'<tr class="level-\w+" data-job="clicks-main">(.*?)</tr>', html, re.S)
    assert row is not None
    cells = row.group(1)
    assert 'data-testid="epoch">5<' in cells
    assert ">main<" in cells
    # the source holds 1000 bytes; the head's offsets read 600 of them
    assert "400 B" in cells


def test_overview_filters_and_says_what_is_wrong_with_a_filter(
    client_for: ClientFor, lineage: Lineage
) -> None:
    client = client_for("viewer")
    assert b"clicks-main" in client.get("/?q=main&application=clicks").content
    assert b'data-job="clicks-main"' not in client.get("/?q=nothing-like-it").content
    bad = client.get("/?state=exploded&application=nope").content.decode()
    assert "is not a job state" in bad and "there is no application" in bad
    # the live refresh returns only the table
    partial = client.get("/", HTTP_HX_REQUEST="true").content.decode()
    assert partial.lstrip().startswith('<div id="overview-live"')


def test_overview_raises_an_alarm_for_a_job_that_stopped_committing(
    client_for: ClientFor, lineage: Lineage, settings: object
) -> None:
    from controlplane.jobs.models import Job
    from controlplane.jobs.services import watch_record

    Job.objects.filter(pk=lineage.job.pk).update(state="running")
    watch_record()  # the reconciler is watching the run: its state is known
    settings.EPOCHAL_STALL_AFTER_S = 0.0  # type: ignore[attr-defined]
    html = client_for("viewer").get("/").content.decode()
    assert "no commit for" in html and "400 bytes of input wait" in html
    assert 'class="level-alarm" data-job="clicks-main"' in html


def test_a_running_job_nobody_watches_shows_unknown(
    client_for: ClientFor, lineage: Lineage, settings: object
) -> None:
    """The database says running, but the reconciler has not watched the run for longer than
    EPOCHAL_UNWATCHED_AFTER_S: the pages say they do not know, and why."""
    import datetime as dt

    from django.utils import timezone

    from controlplane.jobs.models import Job
    from controlplane.jobs.services import watch_record

    Job.objects.filter(pk=lineage.job.pk).update(state="running")
    watch_record(timezone.now() - dt.timedelta(seconds=45))
    client = client_for("viewer")
    overview = client.get("/").content.decode()
    assert '>unknown</span> <span class="muted small">(control plane was down)' in overview
    assert 'class="level-warn" data-job="clicks-main"' in overview
    assert "nothing has watched this job&#x27;s run since" in overview
    job_page = client.get("/jobs/clicks-main/").content.decode()
    assert 'data-testid="state">unknown<' in job_page
    assert "control plane was down · wants running" not in job_page  # desired is stopped here

    watch_record()  # the reconciler is back
    assert 'data-testid="state">running<' in client.get("/jobs/clicks-main/").content.decode()


def test_job_page_shows_charts_allocation_heat_map_and_commits(
    client_for: ClientFor, lineage: Lineage
) -> None:
    page = client_for("viewer").get("/jobs/clicks-main/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "/static/web/vendor/plotly.min.js" in html
    assert 'data-testid="actions"' not in html  # a viewer gets no action buttons
    figures = json.loads(
        re.search(r'id="chart-data" type="application/json">(.*?)</script>', html, re.S).group(1)
    )
    assert set(figures) == {
        "timing",
        "throughput",
        "bytes",
        "dead-letters",
        "parallelism",
        "heatmap",
        "allocation",
    }
    timing = figures["timing"]["data"]
    assert len(timing[0]["x"]) == 6 and timing[0]["y"][-1] == 1.0  # process_s of epoch 5
    assert figures["parallelism"]["data"][0]["y"] == [2, 2, 2, 2, 3, 3]
    allocation = figures["allocation"]["data"]
    assert [t["name"] for t in allocation] == [
        "task 0: key groups 0-2",
        "task 1: key groups 3-5",
        "task 2: key groups 6-7",
    ]
    heat = figures["heatmap"]["data"][0]["z"]
    assert sum(v for row in heat for v in row if v) > 0
    assert 'data-testid="commits"' in html and "rescale" in html
    live = client_for("viewer").get("/jobs/clicks-main/live/").content.decode()
    assert 'id="job-status" class="stats" hx-swap-oob="true"' in live
    assert 'id="chart-data-box" hx-swap-oob="true"' in live


def test_unknown_job_application_version_and_snapshot_are_404_in_words(
    client_for: ClientFor, lineage: Lineage
) -> None:
    client = client_for("viewer")
    for url, words in (
        ("/jobs/nope/", "no job named 'nope'"),
        ("/applications/nope/lineage/", "no application named 'nope'"),
        ("/applications/clicks/versions/9/", "has no version 9"),
        ("/applications/clicks/snapshots/" + "0" * 64 + "/", "has no snapshot"),
    ):
        response = client.get(url)
        assert response.status_code == 404, url
        assert words in text(response), url


def test_lineage_page_draws_every_branch_with_marked_operations(
    client_for: ClientFor, lineage: Lineage
) -> None:
    html = client_for("viewer").get("/applications/clicks/lineage/").content.decode()
    assert 'data-testid="graph"' in html
    for sid in lineage.main + lineage.fork:
        assert f'data-snapshot="{sid}"' in html
    assert 'data-kind="rescale"' in html and 'data-kind="fork"' in html
    assert "tags/sp-1" in html and "heads/exp" in html
    assert "try a new window" in html  # provenance, shown on hover
    # the history of one branch: main's commits without exp's
    only_main = client_for("viewer").get("/applications/clicks/lineage/?branch=main").content
    assert f'data-snapshot="{lineage.fork[0]}"'.encode() not in only_main
    assert f'data-snapshot="{lineage.main[0]}"'.encode() in only_main


def test_lineage_page_pages_through_history_with_a_cursor(
    client_for: ClientFor, lineage: Lineage
) -> None:
    client = client_for("viewer")
    first = client.get("/applications/clicks/lineage/?size=50").content.decode()
    assert 'data-testid="older"' not in first
    bad = client.get("/applications/clicks/lineage/?cursor=garbage").content.decode()
    assert "start again without a cursor" in bad
    found = client.get(f"/applications/clicks/lineage/?at={lineage.main[3][:10]}").content
    assert b'data-testid="snapshot-detail"' in found
    missing = client.get("/applications/clicks/lineage/?at=zzz").content.decode()
    assert "no snapshot, branch or tag" in missing


def test_snapshot_panel_shows_manifest_diff_and_provenance(
    client_for: ClientFor, lineage: Lineage
) -> None:
    client = client_for("viewer")
    url = f"/applications/clicks/snapshots/{lineage.main[4]}/"
    assert client.get(url).status_code == 302  # without htmx: the lineage page opens it
    html = client.get(url, HTTP_HX_REQUEST="true").content.decode()
    assert "rescale" in html and "from_parallelism" in html
    assert 'data-testid="diff-summary"' in html and "parallelism 2 → 3" in html
    assert "clicks-00000.jsonl" in html
    fork = client.get(
        f"/applications/clicks/snapshots/{lineage.fork[0]}/", HTTP_HX_REQUEST="true"
    ).content.decode()
    assert "try a new window" in fork and 'data-testid="provenance"' in fork


def test_state_of_a_key_at_a_snapshot(client_for: ClientFor, lineage: Lineage) -> None:
    client = client_for("viewer")
    url = f"/applications/clicks/snapshots/{lineage.main[2]}/key/"
    found = text(client.get(url, {"key": "user-3"}, HTTP_HX_REQUEST="true"))
    assert 'data-testid="state-row"' in found
    assert '"clicks": 12' in found  # (epoch 2 + 1) * (index 3 + 1)
    on_fork = text(
        client.get(
            f"/applications/clicks/snapshots/{lineage.fork[1]}/key/",
            {"key": "user-3"},
            HTTP_HX_REQUEST="true",
        )
    )
    assert '"clicks": 116' in on_fork
    absent = client.get(url, {"key": "nobody"}, HTTP_HX_REQUEST="true").content.decode()
    assert 'data-testid="no-state"' in absent and "key group" in absent
    empty = client.get(url, {"key": " "})
    assert empty.status_code == 400 and b"type a key to look up" in empty.content


def test_application_and_version_pages(client_for: ClientFor, lineage: Lineage) -> None:
    client = client_for("viewer")
    app = client.get("/applications/clicks/").content.decode()
    assert "clicks-main" in app and "v1" in app and "sp-1" in app and ">exp<" in app
    version = client.get("/applications/clicks/versions/1/").content.decode()
    assert "clickstream" in version and "clicks-main" in version


def test_audit_page_filters_entries(client_for: ClientFor, lineage: Lineage) -> None:
    from controlplane.audit.services import audit_request

    audit_request(user=None, action="POST /api/jobs/", target="x", status_code=201, source="api")
    audit_request(user=None, action="web rescale", target="job a", status_code=400, source="web")
    client = client_for("viewer")
    page = client.get("/audit/").content.decode()
    assert "POST /api/jobs/" in page and "web rescale" in page
    only = client.get("/audit/?action=web").content.decode()
    assert "web rescale" in only and "POST /api/jobs/" not in only
    bad = client.get("/audit/?since=yesterday&operation=42&kind=x").content.decode()
    assert "is not a date" in bad and "is not an operation id" in bad and "is not one of" in bad


def test_input_lag_says_unknown_caught_up_or_waiting(lineage: Lineage) -> None:
    """The job page's input lag: unknown when the source does not report it, never "0 B · not
    read yet" when all input was read."""
    from types import SimpleNamespace

    from django.template.loader import render_to_string

    from controlplane.jobs.health import InputBacklog

    def note(backlog: InputBacklog | None) -> str:
        health = SimpleNamespace(backlog=backlog, alarm="", level="ok")
        html = render_to_string(
            "web/partials/job_status.html",
            {"job": lineage.job, "health": health, "allocation_parallelism": 2},
        )
        value = re.search(r'Input lag</span><span class="value">(.*?)</span>', html)
        text = re.search(r'data-testid="input-lag-note">(.*?)</span>', html)
        assert value and text
        return f"{value.group(1)} · {text.group(1)}"

    assert note(None) == "— · unknown: the source does not report it"
    assert note(InputBacklog(0, "bytes")) == "0 B · caught up: all input read"
    assert note(InputBacklog(2048, "bytes")).endswith(" · input not read yet")
    assert note(InputBacklog(5, "rows")) == "5 rows · input not read yet"


def test_audit_page_shows_details_as_words(client_for: ClientFor, lineage: Lineage) -> None:
    from controlplane.audit.services import audit_request

    audit_request(
        user=None,
        action="web rescale",
        target="job clicks-main",
        status_code=202,
        source="web",
        detail={"params": {"parallelism": 3, "mode": "live"}, "reason": "", "confirmed": True},
    )
    page = client_for("viewer").get("/audit/").content.decode()
    shown = [
        htmllib.unescape(d)
        for d in re.findall(r'data-testid="audit-detail"[^>]*>(.*?)</span>', page)
    ]
    assert "confirmed: yes · params: {mode: live · parallelism: 3}" in shown, shown
    assert "{&#x27;" not in page and "{'" not in page  # no Python dict reprs
