"""`reindex_application` and `manage.py reindex` against real stores built with
`snapshots_store.Repository`."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import models
from hypothesis import HealthCheck, given, settings

from controlplane.applications.models import Application
from controlplane.lineage import selectors
from controlplane.lineage.models import (
    Branch,
    Chain,
    ChainEdge,
    ReflogEntry,
    Snapshot,
    SnapshotParent,
    Tag,
)
from controlplane.lineage.services import ReindexProgress, reindex_application, snapshot_index
from snapshots_store import Manifest, Repository
from snapshots_store.codec import format_timestamp
from snapshots_store.objects import object_key

from .lineages import Lineage, Step, build, steps_strategy

STEPS = [
    Step("commit", 0, 0),
    Step("commit", 0, 0),
    Step("fork", 0, 1),
    Step("commit", 1, 0),
    Step("rollback", 0, 1),
    Step("commit", 0, 0),
    Step("merge", 0, 1),
    Step("fork", 1, 4),
    Step("commit", 2, 0),
]


def build_in_store(repo: Repository, steps: list[Step]) -> Lineage:
    def on_commit(branch: str, manifest: Manifest) -> str:
        head = repo.read_ref(f"heads/{branch}")
        return repo.commit(
            manifest, branch, expected_head=head.target if head else None, reason="epoch"
        )

    def on_move(branch: str, old: str, new: str) -> None:
        repo.cas_ref(f"heads/{branch}", old, new, operation_id="op-rb", reason="rollback")

    return build(steps, on_commit=on_commit, on_move=on_move)


def dump(application: Application) -> dict[str, list[tuple[object, ...]]]:
    """Every index row of `application`, as comparable tuples."""

    def rows(query: models.QuerySet, *fields: str) -> list[tuple[object, ...]]:
        return sorted(query.values_list(*fields))

    snapshots = Snapshot.objects.filter(application=application)
    chains = Chain.objects.filter(application=application)
    return {
        "snapshots": rows(snapshots, "snapshot_id", "generation", "chain_id", "parent_ids"),
        "parents": rows(
            SnapshotParent.objects.filter(child__application=application),
            "child__snapshot_id",
            "parent__snapshot_id",
            "position",
        ),
        "chains": rows(chains, "id", "root_generation", "tip_generation"),
        "edges": rows(
            ChainEdge.objects.filter(from_chain__application=application),
            "from_chain_id",
            "from_generation",
            "to_chain_id",
            "to_generation",
            "first_parent",
        ),
        "branches": rows(Branch.objects.filter(application=application), "name", "head_id"),
        "tags": rows(Tag.objects.filter(application=application), "name", "target_id"),
        "reflog": rows(
            ReflogEntry.objects.filter(application=application), "ref", "seq", "old_id", "new_id"
        ),
    }


def assert_index_matches_store(application: Application, repo: Repository) -> None:
    """The index holds exactly the store's graph: snapshots reachable from refs and reflogs,
    their parents in order, branch heads and complete reflogs."""
    documents = repo.refs.list_documents()
    starts = {doc.target for doc in documents if doc.target}
    for doc in documents:
        starts |= {t for e in repo.reflog(doc.name) for t in (e.old, e.new) if t}
    expected = set().union(*(repo.ancestors(s) for s in starts)) if starts else set()
    indexed = dict(
        Snapshot.objects.filter(application=application).values_list("snapshot_id", "parent_ids")
    )
    assert set(indexed) == expected
    for sid, parents in indexed.items():
        assert tuple(parents) == repo.read_manifest(sid).parents
    heads = {
        name: sid
        for name, sid in Branch.objects.filter(application=application).values_list(
            "name", "head__snapshot_id"
        )
        if sid is not None  # deleted in the store: kept with its reflog, head None
    }
    assert heads == {
        name.removeprefix("heads/"): value.target
        for name, value in repo.list_refs("heads/").items()
    }
    for doc in documents:
        logged = [
            (e.seq, e.old or "", e.new or "", e.operation_id or "", e.reason)
            for e in repo.reflog(doc.name)
        ]
        indexed_log = list(
            ReflogEntry.objects.filter(application=application, ref=doc.name)
            .order_by("seq")
            .values_list("seq", "old_id", "new_id", "operation_id", "reason")
        )
        assert indexed_log == logged


def test_reindex_mirrors_the_store_graph(application: Application, repo: Repository) -> None:
    lineage = build_in_store(repo, STEPS)
    repo.cas_ref("tags/savepoint-1", None, lineage.order[2], reason="savepoint")
    seen: list[ReindexProgress] = []
    result = reindex_application(application=application, repo=repo, progress=seen.append)
    assert result.snapshots_added == len(lineage.order)
    assert result.skipped == ()
    assert (seen[0].phase, seen[-1].phase) == ("refs", "done")
    assert_index_matches_store(application, repo)
    assert (
        selectors.snapshot_get(application=application, rev="savepoint-1").snapshot_id
        == (lineage.order[2])
    )
    for branch in lineage.heads:
        log = selectors.snapshot_log(application=application, rev=branch, limit=1000)
        order = [s.snapshot_id for s in log.snapshots]
        assert set(order) == repo.ancestors(branch)
        position = {sid: i for i, sid in enumerate(order)}
        assert all(
            position[p] > position[s.snapshot_id] for s in log.snapshots for p in s.parent_ids
        )
        first = selectors.snapshot_log(
            application=application, rev=branch, first_parent=True, limit=1000
        )
        assert [s.snapshot_id for s in first.snapshots] == [
            sid for sid, _ in repo.log(branch, first_parent=True)
        ]


def test_reindex_twice_changes_nothing(application: Application, repo: Repository) -> None:
    build_in_store(repo, STEPS)
    reindex_application(application=application, repo=repo)
    before = dump(application)
    again = reindex_application(application=application, repo=repo)
    assert (again.snapshots_added, again.reflog_entries_added) == (0, 0)
    assert dump(application) == before


def test_reindex_after_the_store_moved_on_reads_only_new_commits(
    application: Application, repo: Repository
) -> None:
    lineage = build_in_store(repo, STEPS)
    reindex_application(application=application, repo=repo)
    head = lineage.heads["main"]
    new_ids = []
    for epoch in range(3):
        manifest = repo.read_manifest(head).with_changes(
            parents=(head,),
            epoch=100 + epoch,
            created_at=format_timestamp(datetime(2026, 2, 1 + epoch, tzinfo=UTC)),
        )
        head = repo.commit(manifest, "main", expected_head=head, reason="more")
        new_ids.append(head)
    repo.delete_ref("heads/b2", lineage.heads["b2"], reason="cleanup")

    reads: list[str] = []
    fresh = Repository.open(repo.backend.url.rsplit("/", 1)[0], application.store_namespace)
    original = fresh.read_manifest

    def counting(sid: str) -> Manifest:
        reads.append(sid)
        return original(sid)

    fresh.read_manifest = counting  # type: ignore[method-assign]
    result = reindex_application(application=application, repo=fresh)
    assert result.snapshots_added == 3
    assert sorted(reads) == sorted(new_ids)
    assert result.reflog_entries_added == 4  # three commits on main, one deletion of b2
    assert_index_matches_store(application, repo)
    assert selectors.branch_list(application=application) != selectors.branch_list(
        application=application, include_deleted=True
    )


def test_reindex_equals_indexing_commit_by_commit(tmp_path: Path, db: None) -> None:
    from controlplane.applications.services import application_create

    one = application_create(name="one-by-one")
    bulk = application_create(name="bulk")
    repo = Repository.open(f"file://{tmp_path}", "bulk")
    lineage = build_in_store(repo, STEPS)
    for sid in lineage.order:
        snapshot_index(application=one, snapshot_id=sid, manifest=lineage.manifests[sid])
    reindex_application(application=bulk, repo=repo, batch_size=3)
    for a in lineage.order:
        for b in lineage.order[::3]:
            kwargs = {"a": a, "b": b}
            left = selectors.snapshot_merge_base(application=one, **kwargs)
            right = selectors.snapshot_merge_base(application=bulk, **kwargs)
            assert (left and left.snapshot_id) == (right and right.snapshot_id)
            assert (left and left.snapshot_id) == repo.merge_base(a, b)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=steps_strategy)
def test_reindex_of_random_stores_matches_the_store(
    tmp_path_factory: pytest.TempPathFactory, db: None, steps: list[Step]
) -> None:
    from django.db import transaction

    from controlplane.applications.services import application_create

    root = tmp_path_factory.mktemp("store")
    with transaction.atomic():
        application = application_create(name="random")
        repo = Repository.open(f"file://{root}", "random")
        build_in_store(repo, steps)
        reindex_application(application=application, repo=repo, batch_size=4)
        assert_index_matches_store(application, repo)
        transaction.set_rollback(True)


def test_manage_py_reindex_prints_progress_and_summary(
    tmp_path: Path, db: None, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = Repository.open(f"file://{tmp_path}", "cli-app")
    lineage = build_in_store(repo, STEPS)
    out = io.StringIO()
    call_command(
        "reindex",
        "--application",
        "cli-app",
        "--store",
        f"file://{tmp_path}",
        "--create",
        stdout=out,
    )
    summary = out.getvalue()
    assert f"cli-app: {len(lineage.order)} new snapshots" in summary
    err = capsys.readouterr().err
    # not a terminal: whole lines, no carriage returns, the bar at its quarters
    assert "\r" not in err
    n = len(lineage.order)
    assert f"cli-app: indexing [{'#' * 30}] 100% {n}/{n} snapshots" in err.splitlines()
    assert f"cli-app: indexed {n} of {n} new snapshots" in err
    out = io.StringIO()
    call_command("reindex", "--store", f"file://{tmp_path}", stdout=out)
    assert "cli-app: 0 new snapshots" in out.getvalue()


def test_the_reindex_progress_bar_redraws_one_line_on_a_terminal() -> None:
    from controlplane.lineage.management.commands.reindex import ProgressBar

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    bar = ProgressBar("app", out)
    bar(ReindexProgress("walk", 2, 40, 0))
    bar(ReindexProgress("index", 2, 40, 10))
    bar(ReindexProgress("done", 2, 40, 40))
    screen = out.getvalue()
    assert screen.count("\n") == 1 and screen.endswith("\n")
    assert "\r\033[Kapp: indexing [########----------------------]  25% 10/40 snapshots" in screen


def test_manage_py_reindex_names_an_unknown_application(tmp_path: Path, db: None) -> None:
    with pytest.raises(CommandError, match="no application named 'nope'"):
        call_command("reindex", "--application", "nope", "--store", f"file://{tmp_path}")


def test_deleting_an_application_removes_its_index(
    application: Application, repo: Repository
) -> None:
    build_in_store(repo, STEPS)
    reindex_application(application=application, repo=repo)
    application.delete()
    assert not Snapshot.objects.exists()
    assert not Chain.objects.exists()
    assert not ReflogEntry.objects.exists()


def test_reindex_skips_history_that_gc_collected(
    application: Application, repo: Repository
) -> None:
    """A rollback leaves the abandoned commits reachable only through the reflog; once gc
    has collected one of them, reindex indexes everything else and reports the gap."""
    lineage = build_in_store(repo, [Step("commit", 0, 0)] * 3 + [Step("rollback", 0, 1)])
    abandoned = lineage.order[-2:]  # the rollback moved main back two commits
    assert lineage.heads["main"] == lineage.order[1]
    repo.backend.delete(object_key(abandoned[0]))  # as gc would after retention
    fresh = Repository.open(repo.backend.url.rsplit("/", 1)[0], application.store_namespace)
    result = reindex_application(application=application, repo=fresh)
    assert result.missing == (abandoned[0],)
    assert result.skipped == (abandoned[1],)
    indexed = set(
        Snapshot.objects.filter(application=application).values_list("snapshot_id", flat=True)
    )
    assert indexed == set(lineage.order[:2])
    assert (
        selectors.snapshot_get(application=application, rev="main").snapshot_id
        == (lineage.order[1])
    )
