"""Selectors against a naive oracle over random lineages (forks, rollbacks, merges).

The same check runs on whatever database is configured and, marked `services`, on
PostgreSQL through the `postgresql_db` fixture (skipped, or failed in CI, without it).
"""

from __future__ import annotations

import random
import uuid
from functools import partial

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings

from controlplane.applications.services import application_create
from controlplane.lineage import selectors
from controlplane.lineage.services import ref_move_index, snapshot_index
from snapshots_store import ReflogEntry, graph

from .lineages import Lineage, Oracle, Step, build, steps_strategy

PROPERTY_SETTINGS = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def index_lineage(lineage: Lineage):
    application = application_create(name=f"app-{uuid.uuid4().hex[:8]}")
    for sid in lineage.order:
        snapshot_index(application=application, snapshot_id=sid, manifest=lineage.manifests[sid])
    seqs: dict[str, int] = {}
    for branch, old, new in lineage.moves:
        seqs[branch] = seqs.get(branch, 0) + 1
        entry = ReflogEntry(seqs[branch], old, new, None, "test", "2026-01-01T00:00:00Z")
        ref_move_index(application=application, ref=f"heads/{branch}", entry=entry)
    return application


def page_all(fetch, limit: int) -> list:
    """Follow cursors to the end; returns every item in order."""
    items, cursor = [], None
    for _ in range(10_000):
        page = fetch(limit=limit, cursor=cursor)
        items.extend(getattr(page, "snapshots", None) or getattr(page, "snapshot_ids", []))
        cursor = page.next_cursor
        if cursor is None:
            return items
    raise AssertionError("pagination did not end")


def check_selectors_against_oracle(steps: list[Step], seed: int) -> None:
    lineage = build(steps)
    oracle = Oracle(lineage)
    rng = random.Random(seed)
    with transaction.atomic():
        app = index_lineage(lineage)
        ids = lineage.order
        sample = ids if len(ids) <= 12 else rng.sample(ids, 12)
        for sid in sample:
            limit = rng.randint(1, 6)
            ancestors = page_all(
                partial(selectors.snapshot_ancestors, application=app, rev=sid), limit
            )
            assert ancestors == oracle.topo(sid)
            full = page_all(partial(selectors.snapshot_log, application=app, rev=sid), limit)
            assert [s.snapshot_id for s in full] == oracle.topo(sid)
            for summary in full:
                manifest = lineage.manifests[summary.snapshot_id]
                assert summary.parent_ids == manifest.parents
                assert (summary.epoch, summary.kind, summary.branch) == (
                    manifest.epoch,
                    manifest.kind,
                    manifest.branch,
                )
                assert summary.offsets == manifest.offsets
                assert summary.stats == manifest.stats
                assert summary.provenance == manifest.provenance
            first = page_all(
                partial(selectors.snapshot_log, application=app, rev=sid, first_parent=True), limit
            )
            assert [s.snapshot_id for s in first] == oracle.first_parent(sid)
        for _ in range(15):
            a, b = rng.choice(ids), rng.choice(ids)
            assert selectors.snapshot_is_ancestor(application=app, ancestor=a, descendant=b) == (
                a in oracle.ancestors(b)
            )
            bases = selectors.snapshot_merge_bases(application=app, a=a, b=b)
            expected = oracle.merge_bases(a, b)
            assert [s.snapshot_id for s in bases] == expected
            # ... and the store's own graph walk agrees on the pick.
            assert expected[:1] == [
                x for x in [graph.merge_base(lineage.manifests.__getitem__, a, b)] if x
            ]
            base = selectors.snapshot_merge_base(application=app, a=a, b=b)
            assert (base.snapshot_id if base else None) == (expected[0] if expected else None)
        for branch, head in lineage.heads.items():
            assert selectors.snapshot_get(application=app, rev=branch).snapshot_id == head
            assert selectors.snapshot_get(application=app, rev=f"heads/{branch}").pk
        seen = page_all(
            lambda **kw: selectors.lineage_graph_page(
                application=app, limit=kw["limit"], cursor=kw["cursor"]
            ),
            5,
        )
        assert [s.snapshot_id for s in seen] == list(reversed(ids))
        transaction.set_rollback(True)


@PROPERTY_SETTINGS
@given(steps=steps_strategy, seed=steps_strategy.map(len))
def test_selectors_match_oracle_on_configured_database(
    db: None, steps: list[Step], seed: int
) -> None:
    check_selectors_against_oracle(steps, seed)


@pytest.mark.services
@PROPERTY_SETTINGS
@given(steps=steps_strategy, seed=steps_strategy.map(len))
def test_selectors_match_oracle_on_postgresql(
    postgresql_db: None, steps: list[Step], seed: int
) -> None:
    check_selectors_against_oracle(steps, seed)


def test_graph_page_lists_edges_and_refs(db: None) -> None:
    lineage = build([Step("commit", 0, 0), Step("fork", 0, 0), Step("merge", 0, 1)])
    app = index_lineage(lineage)
    page = selectors.lineage_graph_page(application=app, limit=10)
    assert page.next_cursor is None
    edges = {(e.child, e.parent, e.position) for e in page.edges}
    expected = {
        (sid, parent, i) for sid in lineage.order for i, parent in enumerate(lineage.parents(sid))
    }
    assert edges == expected
    assert {ref for refs in page.refs.values() for ref in refs} == {
        f"heads/{b}" for b in lineage.heads
    }
    for branch, head in lineage.heads.items():
        assert f"heads/{branch}" in page.refs[head]


def test_branch_tag_and_reflog_listings(db: None) -> None:
    lineage = build([Step("commit", 0, 0), Step("commit", 0, 0), Step("rollback", 0, 0)])
    app = index_lineage(lineage)
    main = selectors.branch_list(application=app)
    assert [(b.name, b.head.snapshot_id) for b in main] == [("main", lineage.heads["main"])]
    reflog = selectors.reflog_list(application=app, ref="heads/main")
    assert [e.seq for e in reflog] == [4, 3, 2, 1]
    assert reflog[0].new_id == lineage.heads["main"]
    assert [
        e.seq for e in selectors.reflog_list(application=app, ref="heads/main", before_seq=3)
    ] == [2, 1]
    entry = ReflogEntry(1, None, lineage.order[0], "op-1", "savepoint", "2026-01-01T00:00:00Z")
    ref_move_index(application=app, ref="tags/sp1", entry=entry)
    assert [(t.name, t.target.snapshot_id) for t in selectors.tag_list(application=app)] == [
        ("sp1", lineage.order[0])
    ]
    assert selectors.snapshot_get(application=app, rev="sp1").snapshot_id == lineage.order[0]
