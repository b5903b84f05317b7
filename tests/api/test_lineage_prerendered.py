"""The lineage page built by PostgreSQL (`lineage_graph_page_json`) answers the same bytes
as the page rendered in Python (`lineage_graph_page`, the path SQLite and the browsable API
take), on every page, with merges, refs, odd strings and whole-second timestamps."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from controlplane.lineage import selectors
from controlplane.lineage.models import Branch, Snapshot
from tests.api.conftest import Lineage

Client = Callable[[str | None], APIClient]
PAGE = "/api/applications/clicks/lineage/"


@pytest.fixture
def awkward(lineage: Lineage) -> Lineage:
    """The lineage with what JSON text must get right: a merge (two parents), two refs on
    one snapshot, quotes, backslashes, control characters, non-ASCII and U+2028 in strings,
    a whole-second and a sub-second timestamp."""
    rows = Snapshot.objects.filter(application=lineage.application)
    rows.filter(snapshot_id=lineage.main[-1]).update(
        parent_ids=[lineage.main[-2], lineage.fork[-1]],
        code_version='v"1\\\n\t\x01 é \u2028 \u2029 🚀',
        created_at=datetime(2026, 11, 27, 8, 0, 0, tzinfo=UTC),
    )
    rows.filter(snapshot_id=lineage.main[-2]).update(
        config_hash="</script>", created_at=datetime(2026, 11, 27, 8, 0, 0, 7, tzinfo=UTC)
    )
    head = rows.get(snapshot_id=lineage.main[-1])
    Branch.objects.create(application=lineage.application, name="zz-copy", head=head)
    return lineage


def _pages(client: APIClient, url: str | None) -> list[bytes]:
    bodies = []
    while url:
        response = client.get(url, HTTP_ACCEPT="application/json")
        assert response.status_code == 200, response.content
        assert response["Content-Type"] == "application/json"
        bodies.append(response.content)
        url = json.loads(response.content)["next"]
    return bodies


@pytest.mark.parametrize("query", ["?limit=3", "?limit=1000", "?limit=2&cursor=1", ""])
def test_the_prerendered_page_is_byte_for_byte_the_rendered_one(
    awkward: Lineage, client_for: Client, settings: Any, query: str
) -> None:
    settings.EPOCHAL_RESPONSE_CACHE_BYTES = 0  # both paths build their answer
    viewer = client_for("viewer")
    settings.EPOCHAL_PRERENDERED_JSON = True
    fast = _pages(viewer, PAGE + query)
    settings.EPOCHAL_PRERENDERED_JSON = False
    python = _pages(viewer, PAGE + query)
    assert fast == python
    pages = [json.loads(body) for body in python]
    if query == "?limit=2&cursor=1":  # the cursor before every row: an empty page
        assert pages == [{"next": None, "previous": None, "results": [], "edges": [], "refs": {}}]
        return
    results = {s["snapshot_id"]: s for page in pages for s in page["results"]}
    refs = {k: v for page in pages for k, v in page["refs"].items()}
    merge = results[awkward.main[-1]]
    assert merge["created_at"] == "2026-11-27T08:00:00Z"
    assert results[awkward.main[-2]]["created_at"] == "2026-11-27T08:00:00.000007Z"
    assert merge["parents"] == [awkward.main[-2], awkward.fork[-1]]
    assert merge["code_version"] == 'v"1\\\n\t\x01 é \u2028 \u2029 🚀'
    assert refs[awkward.main[-1]] == ["heads/main", "heads/zz-copy"]
    assert len(results) == len(awkward.main) + len(awkward.fork)


def test_postgresql_builds_the_page_and_other_databases_render_it(
    awkward: Lineage, client_for: Client, settings: Any, django_assert_max_num_queries: Any
) -> None:
    built = selectors.lineage_graph_page_json(
        application=awkward.application, url_prefix="http://x/", limit=3
    )
    if connection.vendor != "postgresql":
        assert built is None
        return
    assert built is not None
    page = selectors.lineage_graph_page(application=awkward.application, limit=3)
    assert built.next_cursor == page.next_cursor
    assert [s["snapshot_id"] for s in json.loads(f"[{built.results}]")] == [
        s.snapshot_id for s in page.snapshots
    ]
    assert json.loads(f"[{built.edges}]") == [
        {"child": e.child, "parent": e.parent, "position": e.position} for e in page.edges
    ]
    assert json.loads(f"{{{built.refs}}}") == page.refs
    settings.EPOCHAL_RESPONSE_CACHE_BYTES = 0
    viewer = client_for("viewer")
    viewer.get(PAGE)  # the token and the application are known
    with django_assert_max_num_queries(3):
        assert viewer.get(PAGE + "?limit=3").status_code == 200


def test_the_browsable_api_and_indented_json_take_the_rendered_path(
    awkward: Lineage, client_for: Client, settings: Any
) -> None:
    settings.EPOCHAL_RESPONSE_CACHE_BYTES = 0
    viewer = client_for("viewer")
    indented = viewer.get(PAGE + "?limit=2", HTTP_ACCEPT="application/json; indent=2")
    assert indented.status_code == 200 and b'\n  "next"' in indented.content
    plain = json.loads(viewer.get(PAGE + "?limit=2", HTTP_ACCEPT="application/json").content)
    assert json.loads(indented.content) == plain
    html = viewer.get(PAGE + "?limit=2", HTTP_ACCEPT="text/html")
    assert html.status_code == 200 and html["Content-Type"].startswith("text/html")


LOG = "/api/applications/clicks/snapshots/"


@pytest.mark.parametrize(
    "query",
    [
        "?rev=heads/exp&limit=2",
        "?rev=heads/exp&limit=2&first_parent=true",
        "?rev=main&limit=1000",
        "?rev=tags/sp-1&first_parent=1&limit=1",
        "",
    ],
)
def test_the_prerendered_log_is_byte_for_byte_the_rendered_one(
    awkward: Lineage, client_for: Client, settings: Any, query: str
) -> None:
    settings.EPOCHAL_RESPONSE_CACHE_BYTES = 0
    viewer = client_for("viewer")
    settings.EPOCHAL_PRERENDERED_JSON = True
    fast = _pages(viewer, LOG + query)
    settings.EPOCHAL_PRERENDERED_JSON = False
    python = _pages(viewer, LOG + query)
    assert fast == python
    results = [s for body in python for s in json.loads(body)["results"]]
    urls = {s["url"] for s in results}
    assert results and urls == {f"http://testserver{LOG}{s['snapshot_id']}/" for s in results}
    if "exp" in query:
        assert [s["snapshot_id"] for s in results] == [*awkward.fork[::-1], *awkward.main[1::-1]]


def test_the_log_json_comes_from_postgresql_only(awkward: Lineage) -> None:
    start = selectors.snapshot_log_start(
        application=awkward.application, rev="heads/exp", first_parent=False
    )
    built = selectors.snapshot_log_page_json(start, limit=3)
    page = selectors.snapshot_log_page(start, limit=3)
    if connection.vendor != "postgresql":
        assert built is None
        return
    assert built is not None and built.next_cursor == page.next_cursor
    assert [sid for sid, _ in built.rows] == [s.snapshot_id for s in page.snapshots]
