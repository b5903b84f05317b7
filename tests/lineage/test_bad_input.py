"""Bad input gives domain errors that say what is wrong and what to do; nothing is written."""

from __future__ import annotations

import pytest

from controlplane.applications.errors import UnknownApplicationError
from controlplane.applications.models import Application
from controlplane.applications.selectors import application_get
from controlplane.lineage import selectors
from controlplane.lineage.errors import (
    InvalidCursorError,
    InvalidRefError,
    InvalidSnapshotError,
    MissingParentError,
    UnknownRevisionError,
)
from controlplane.lineage.models import ReflogEntry, Snapshot
from controlplane.lineage.services import ref_move_index, snapshot_index
from snapshots_store import ReflogEntry as StoreReflogEntry

from .lineages import Step, build

UNKNOWN = "f" * 64


@pytest.fixture
def indexed(application: Application) -> tuple[Application, list[str]]:
    lineage = build([Step("commit", 0, 0), Step("commit", 0, 0)])
    for sid in lineage.order:
        snapshot_index(application=application, snapshot_id=sid, manifest=lineage.manifests[sid])
    entry = StoreReflogEntry(1, None, lineage.order[-1], None, "test", "2026-01-01T00:00:00Z")
    ref_move_index(application=application, ref="heads/main", entry=entry)
    return application, lineage.order


def test_unknown_application_is_named(db: None) -> None:
    with pytest.raises(UnknownApplicationError, match="no application named 'ghost'"):
        application_get(name="ghost")


@pytest.mark.parametrize("rev", [UNKNOWN, "nobranch", "heads/nobranch", "tags/none", "", "../x"])
def test_unknown_revision_says_what_to_do(indexed: tuple[Application, list[str]], rev: str) -> None:
    app, _ = indexed
    with pytest.raises(UnknownRevisionError, match=r"reindex|revision"):
        selectors.snapshot_log(application=app, rev=rev)
    with pytest.raises(UnknownRevisionError):
        selectors.snapshot_merge_base(application=app, a="main", b=rev)


def test_snapshots_of_another_application_are_unknown(
    indexed: tuple[Application, list[str]],
) -> None:
    _, ids = indexed
    other = Application.objects.create(name="other", store_namespace="other")
    with pytest.raises(UnknownRevisionError, match="'other'"):
        selectors.snapshot_get(application=other, rev=ids[0])


def test_indexing_before_the_parent_is_refused(application: Application) -> None:
    lineage = build([Step("commit", 0, 0)])
    child = lineage.order[1]
    with pytest.raises(MissingParentError, match=lineage.order[0]):
        snapshot_index(
            application=application, snapshot_id=child, manifest=lineage.manifests[child]
        )
    assert not Snapshot.objects.filter(application=application).exists()


@pytest.mark.parametrize("snapshot_id", [UNKNOWN, "main", "../../etc/passwd", ""])
def test_a_snapshot_id_must_be_the_manifests_content_address(
    application: Application, snapshot_id: str
) -> None:
    manifest = build([]).manifests
    root = next(iter(manifest.values()))
    with pytest.raises(InvalidSnapshotError, match="not the id of this manifest"):
        snapshot_index(application=application, snapshot_id=snapshot_id, manifest=root)
    assert not Snapshot.objects.filter(application=application).exists()


def test_indexing_twice_is_a_no_op(indexed: tuple[Application, list[str]]) -> None:
    app, ids = indexed
    lineage = build([Step("commit", 0, 0), Step("commit", 0, 0)])
    before = Snapshot.objects.filter(application=app).count()
    snapshot_index(application=app, snapshot_id=ids[1], manifest=lineage.manifests[ids[1]])
    assert Snapshot.objects.filter(application=app).count() == before


def test_ref_moves_need_a_valid_ref_and_an_indexed_target(
    indexed: tuple[Application, list[str]],
) -> None:
    app, ids = indexed
    entry = StoreReflogEntry(2, ids[-1], UNKNOWN, None, "test", "2026-01-01T00:00:00Z")
    with pytest.raises(UnknownRevisionError, match="not indexed"):
        ref_move_index(application=app, ref="heads/main", entry=entry)
    with pytest.raises(InvalidRefError, match="heads/<branch>"):
        ref_move_index(application=app, ref="main", entry=entry)
    assert ReflogEntry.objects.filter(application=app).count() == 1
    assert selectors.snapshot_get(application=app, rev="main").snapshot_id == ids[-1]


def test_an_older_reflog_entry_does_not_move_the_branch_back(
    indexed: tuple[Application, list[str]],
) -> None:
    app, ids = indexed
    later = StoreReflogEntry(3, ids[-1], ids[0], None, "rollback", "2026-01-01T00:00:00Z")
    ref_move_index(application=app, ref="heads/main", entry=later)
    stale = StoreReflogEntry(2, ids[0], ids[1], None, "late", "2026-01-01T00:00:00Z")
    ref_move_index(application=app, ref="heads/main", entry=stale)
    assert selectors.snapshot_get(application=app, rev="main").snapshot_id == ids[0]
    assert [e.seq for e in selectors.reflog_list(application=app, ref="heads/main")] == [3, 2, 1]


@pytest.mark.parametrize("cursor", ["", "12", "x:y", f"-1:{UNKNOWN}", f"3:{UNKNOWN[:10]}"])
def test_a_foreign_cursor_is_refused(indexed: tuple[Application, list[str]], cursor: str) -> None:
    app, _ = indexed
    with pytest.raises(InvalidCursorError, match="start again"):
        selectors.snapshot_ancestors(application=app, rev="main", cursor=cursor)


@pytest.mark.parametrize("limit", [0, -1, 1001, True])
def test_page_limits_are_bounded(indexed: tuple[Application, list[str]], limit: int) -> None:
    app, _ = indexed
    with pytest.raises(ValueError, match="limit must be"):
        selectors.snapshot_log(application=app, rev="main", limit=limit)


def test_reflog_of_an_unknown_ref(indexed: tuple[Application, list[str]]) -> None:
    app, _ = indexed
    with pytest.raises(UnknownRevisionError, match="no reflog"):
        selectors.reflog_list(application=app, ref="heads/ghost")


def test_graph_page_cursor_must_be_one_it_handed_out(
    indexed: tuple[Application, list[str]],
) -> None:
    app, _ = indexed
    with pytest.raises(InvalidCursorError):
        selectors.lineage_graph_page(application=app, cursor="abc")
