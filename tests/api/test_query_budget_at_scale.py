"""The query budget holds however long the history is: every lineage and job read asks the
same number of statements (at most three, authentication included) of an application with
2,000 snapshots and of one with 200,000, both bulk-loaded (COPY) on PostgreSQL by the lineage
benchmark's builder (forks, rollbacks, merges over 100 branches).

Why 200,000 and not a million: the counts depend on the shape of a page (its chains), not
on the number of rows — the size-independence asserted here is the property; a million
takes 2-3 minutes of a 2-core CI machine just to load, 200,000 about 30 s. `bench.api`
runs the same endpoints over any size (`--snapshots 1000000`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from bench.lineage import build_index
from controlplane.applications.services import version_create
from controlplane.jobs.services import job_create

Client = Callable[[str | None], APIClient]
SMALL, LARGE = 2_000, 200_000


def _counts(client: APIClient, name: str, facts: dict[str, Any]) -> dict[str, int]:
    version = version_create(application=facts["application"], job="clickstream")
    job_create(name=f"{name}-job", application=facts["application"], version=version)
    branch = facts["branch_names"][len(facts["branch_names"]) // 2]
    middle = facts["snapshot_ids"][len(facts["snapshot_ids"]) // 2]
    base = f"/api/applications/{name}"
    reads = {
        "job": f"/api/jobs/{name}-job/",
        "branches": f"{base}/branches/",
        "log": f"{base}/snapshots/?rev=heads/{branch}&limit=50",
        "log_first_parent": f"{base}/snapshots/?rev=heads/{branch}&limit=50&first_parent=true",
        "log_of_old_snapshot": f"{base}/snapshots/?rev={middle}&limit=50",
        "graph": f"{base}/lineage/?limit=100",
        "graph_deep": f"{base}/lineage/?limit=100&cursor={facts['middle_pk']}",
        "snapshot": f"{base}/snapshots/{middle}/",
    }
    counts = {}
    for key, url in reads.items():
        client.get(url)  # warm the per-process caches (application ids): steady state
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url)
        assert response.status_code == 200, (url, response.content[:300])
        counts[key] = len(queries.captured_queries)
        etag = response.get("ETag")
        if etag:
            with CaptureQueriesContext(connection) as queries:
                again = client.get(url, HTTP_IF_NONE_MATCH=etag)
            assert again.status_code == 304
            counts[f"{key}_304"] = len(queries.captured_queries)
    return counts


def test_reads_ask_the_same_few_queries_at_any_history_length(
    postgresql_db: None, client_for: Client, store_url: str
) -> None:
    viewer = client_for("viewer")
    counts = {}
    for name, size in (("small", SMALL), ("large", LARGE)):
        facts = build_index(snapshots=size, branches=100, seed=3, name=name)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id FROM lineage_snapshot WHERE application_id = %s ORDER BY id "
                "OFFSET %s LIMIT 1",
                [facts["application"].pk, len(facts["snapshot_ids"]) // 2],
            )
            facts["middle_pk"] = cursor.fetchone()[0]
        counts[name] = _counts(viewer, name, facts)
    assert counts["large"] == counts["small"]
    over = {k: n for k, n in counts["large"].items() if n > (2 if k.endswith("_304") else 3)}
    assert over == {}, counts["large"]
