"""Writes to the lineage index: index manifests and ref moves, rebuild from the store.

Every write for one application takes a row lock on the application first, so concurrent
indexers (the reconciler, `manage.py reindex`, a commit notification) serialise and chain
placement stays consistent. Snapshots are always indexed after their parents, so an indexed
snapshot's whole history is indexed: that is what lets `reindex_application` stop walking at
the first known snapshot.
"""

from __future__ import annotations

import heapq
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import count, islice
from typing import TypeVar

from django.db import models, transaction

from controlplane.applications.models import Application
from controlplane.lineage.bulk import insert_rows, reserve_ids
from controlplane.lineage.chains import ChainPlanner, Edge
from controlplane.lineage.errors import (
    InvalidRefError,
    InvalidSnapshotError,
    MissingParentError,
    UnknownRevisionError,
)
from controlplane.lineage.models import (
    Branch,
    Chain,
    ChainEdge,
    ReflogEntry,
    Snapshot,
    SnapshotParent,
    Tag,
)
from controlplane.lineage.sink_facts import sink_facts
from snapshots_store import Manifest, ObjectNotFoundError, Repository
from snapshots_store import ReflogEntry as StoreReflogEntry
from snapshots_store.codec import parse_timestamp
from snapshots_store.objects import object_id

_CHUNK = 1000
_T = TypeVar("_T")


@dataclass(frozen=True)
class ReindexProgress:
    """Where a reindex is: `phase` is "refs", "walk", "index" or "done"."""

    phase: str
    refs: int
    snapshots_found: int
    snapshots_indexed: int


@dataclass(frozen=True)
class ReindexResult:
    application: str
    refs: int
    snapshots_added: int
    snapshots_total: int
    reflog_entries_added: int
    skipped: tuple[str, ...]  # found, but part of their history is missing from the store
    missing: tuple[str, ...]  # named by a reflog entry or a parent, absent from the store
    seconds: float

    @property
    def snapshots_per_s(self) -> float:
        return self.snapshots_added / self.seconds if self.seconds > 0 else 0.0


ProgressCallback = Callable[[ReindexProgress], None]


# -- public services ------------------------------------------------------------------------


def snapshot_index(*, application: Application, snapshot_id: str, manifest: Manifest) -> Snapshot:
    """Index one manifest (idempotent). Its parents must be indexed already, and
    `snapshot_id` must be the manifest's content address."""
    expected = object_id("manifest", manifest.to_bytes())
    if snapshot_id != expected:
        raise InvalidSnapshotError(snapshot_id, expected)
    _index_manifests(application=application, items=[(snapshot_id, manifest)])
    return Snapshot.objects.get(application=application, snapshot_id=snapshot_id)


def ref_move_index(*, application: Application, ref: str, entry: StoreReflogEntry) -> None:
    """Record move `entry` of `ref` (``heads/x`` / ``tags/y``) and, when it is the newest move
    indexed, point the branch or tag at its target (idempotent; target must be indexed)."""
    with transaction.atomic():
        _lock(application)
        _apply_ref_moves(application, {ref: [entry]})


def reindex_application(
    *,
    application: Application,
    repo: Repository,
    progress: ProgressCallback | None = None,
    batch_size: int = 5000,
) -> ReindexResult:
    """Bring the index of `application` up to date with `repo` (idempotent, incremental).

    Walks from every ref and every not-yet-indexed reflog target back to the first snapshots
    already indexed, indexes what is new parents first in batches (each batch its own
    transaction, so an interrupted run resumes), then records the new reflog entries and ref
    positions. Snapshots whose history is incomplete in the store (collected by gc, or damaged)
    are skipped and reported.
    """
    started = time.monotonic()
    report = progress or (lambda _: None)
    documents = repo.refs.list_documents()
    indexed_seq = _indexed_reflog_seqs(application)
    moves: dict[str, list[StoreReflogEntry]] = {}
    starts: list[str] = []
    for doc in documents:
        if doc.target is not None:
            starts.append(doc.target)
        have = indexed_seq.get(doc.name, 0)
        if doc.seq > have:
            entries = repo.reflog(doc.name, limit=doc.seq - have)
            moves[doc.name] = entries
            starts.extend(t for e in entries for t in (e.old, e.new) if t is not None)
    report(ReindexProgress("refs", len(documents), 0, 0))

    found, missing = _walk_new(
        application, repo, starts, documents_count=len(documents), report=report
    )
    ordered, skipped = _parents_first(found, missing)
    live_targets = {doc.target for doc in documents if doc.target is not None}
    broken = sorted(live_targets & (set(skipped) | missing))
    if broken:
        raise UnknownRevisionError(
            application.name,
            broken[0],
            "a live ref points at a snapshot whose history is incomplete in the store; "
            "run `python -m snapshots_store fsck`",
        )

    indexed = 0
    for batch in _batches(ordered, batch_size):
        indexed += _index_manifests(application=application, items=batch)
        report(ReindexProgress("index", len(documents), len(ordered), indexed))

    with transaction.atomic():
        _lock(application)
        entries_added = _apply_ref_moves(application, moves)
    total = Snapshot.objects.filter(application=application).count()
    report(ReindexProgress("done", len(documents), len(ordered), indexed))
    return ReindexResult(
        application=application.name,
        refs=len(documents),
        snapshots_added=indexed,
        snapshots_total=total,
        reflog_entries_added=entries_added,
        skipped=tuple(skipped),
        missing=tuple(sorted(missing)),
        seconds=time.monotonic() - started,
    )


def refresh_sink_facts(
    *, application: Application, repo: Repository, limit: int | None = None
) -> int:
    """Fill `Snapshot.sinks` of epochs indexed without it (before the field existed) from
    their manifests, newest first (`limit`: at most that many read); the count filled. A
    snapshot whose manifest names no sink keeps its empty facts and is read again by the
    next call; one the store no longer has is passed over."""
    rows = Snapshot.objects.filter(application=application, sinks={}, epoch__gte=1)
    ids = rows.order_by("-id").values_list("pk", "snapshot_id")
    filled = 0
    for pk, snapshot_id in ids if limit is None else ids[:limit]:
        try:
            facts = sink_facts(repo.read_manifest(snapshot_id))
        except ObjectNotFoundError:
            continue
        if facts:
            filled += Snapshot.objects.filter(pk=pk).update(sinks=facts)
    return filled


# -- indexing manifests ---------------------------------------------------------------------


def _lock(application: Application) -> None:
    Application.objects.select_for_update().filter(pk=application.pk).values_list("pk").first()


def _index_manifests(*, application: Application, items: Sequence[tuple[str, Manifest]]) -> int:
    """Index manifests given parents first; returns how many were new."""
    with transaction.atomic():
        _lock(application)
        existing = _indexed_ids(application, [sid for sid, _ in items])
        todo: dict[str, Manifest] = {}
        for sid, manifest in items:
            if sid not in existing and sid not in todo:
                todo[sid] = manifest
        if not todo:
            return 0
        outside = {p for m in todo.values() for p in m.parents if p not in todo}
        known = _places(application, outside)
        tips = dict(
            Chain.objects.filter(pk__in={chain for _, chain, _ in known.values()}).values_list(
                "pk", "tip_generation"
            )
        )
        provisional = count(-1, -1)
        planner = ChainPlanner(
            new_chain=lambda: next(provisional),
            places={sid: (chain, gen) for sid, (_, chain, gen) in known.items()},
            tips=dict(tips),  # a copy: `tips` stays what the database holds
        )
        placements = []
        for sid, manifest in todo.items():
            for parent in manifest.parents:
                if parent not in planner.places:
                    raise MissingParentError(application.name, sid, parent)
            placements.append(planner.place(sid, manifest.parents))

        new_chains = sorted({p.chain for p in placements if p.chain < 0}, reverse=True)
        chain_ids = dict(zip(new_chains, reserve_ids(Chain, len(new_chains)), strict=True))
        pks = dict(zip(todo, reserve_ids(Snapshot, len(todo)), strict=True))
        pks.update({sid: pk for sid, (pk, _, _) in known.items()})

        def real(chain: int) -> int:
            return chain_ids.get(chain, chain)

        roots = {p.chain: p.generation for p in placements if p.opens_chain}
        insert_rows(
            Chain,
            CHAIN_COLUMNS,
            [(chain_ids[c], application.pk, roots[c], planner.tips[c]) for c in new_chains],
        )
        for chain, tip in planner.tips.items():
            if chain > 0 and tips.get(chain) != tip:
                Chain.objects.filter(pk=chain).update(tip_generation=tip)
        insert_rows(
            Snapshot,
            SNAPSHOT_COLUMNS,
            (
                snapshot_row(
                    pk=pks[sid],
                    application_id=application.pk,
                    snapshot_id=sid,
                    manifest=manifest,
                    first_parent_pk=pks[manifest.parents[0]] if manifest.parents else None,
                    generation=placement.generation,
                    chain=real(placement.chain),
                )
                for (sid, manifest), placement in zip(todo.items(), placements, strict=True)
            ),
        )
        insert_rows(
            SnapshotParent,
            PARENT_COLUMNS,
            (
                (pks[sid], pks[parent], position)
                for sid, manifest in todo.items()
                for position, parent in enumerate(manifest.parents)
            ),
        )
        insert_rows(
            ChainEdge,
            EDGE_COLUMNS,
            (edge_row(e, real) for placement in placements for e in placement.edges),
        )
        return len(todo)


CHAIN_COLUMNS = ("id", "application_id", "root_generation", "tip_generation")
SNAPSHOT_COLUMNS = (
    "id",
    "application_id",
    "snapshot_id",
    "branch",
    "epoch",
    "kind",
    "parallelism",
    "max_parallelism",
    "code_version",
    "config_hash",
    "operation_id",
    "created_at",
    "offsets",
    "stats",
    "provenance",
    "parent_ids",
    "parent_count",
    "first_parent_id",
    "generation",
    "chain_id",
    "sinks",
)
PARENT_COLUMNS = ("child_id", "parent_id", "position")
EDGE_COLUMNS = ("from_chain_id", "from_generation", "to_chain_id", "to_generation", "first_parent")


def snapshot_row(
    *,
    pk: int,
    application_id: int,
    snapshot_id: str,
    manifest: Manifest,
    first_parent_pk: int | None,
    generation: int,
    chain: int,
) -> tuple[object, ...]:
    """A snapshot row in SNAPSHOT_COLUMNS order (also used by the benchmark's loader)."""
    return (
        pk,
        application_id,
        snapshot_id,
        manifest.branch,
        manifest.epoch,
        manifest.kind,
        manifest.parallelism,
        manifest.max_parallelism,
        manifest.code_version,
        manifest.config_hash,
        manifest.operation_id or "",
        parse_timestamp(manifest.created_at),
        json.dumps({s: dict(parts) for s, parts in manifest.offsets.items()}),
        json.dumps(dict(manifest.stats)),
        json.dumps(dict(manifest.provenance)),
        json.dumps(list(manifest.parents)),
        len(manifest.parents),
        first_parent_pk,
        generation,
        chain,
        json.dumps(sink_facts(manifest)),
    )


def edge_row(edge: Edge, real: Callable[[int], int] = int) -> tuple[object, ...]:
    """A chain-edge row in EDGE_COLUMNS order; `real` maps provisional chain ids."""
    return (
        real(edge.from_chain),
        edge.from_generation,
        real(edge.to_chain),
        edge.to_generation,
        edge.first_parent,
    )


def _indexed_ids(application: Application, ids: Iterable[str]) -> set[str]:
    found: set[str] = set()
    for chunk in _batches(list(dict.fromkeys(ids)), _CHUNK):
        found.update(
            Snapshot.objects.filter(application=application, snapshot_id__in=chunk).values_list(
                "snapshot_id", flat=True
            )
        )
    return found


def _places(application: Application, ids: Iterable[str]) -> dict[str, tuple[int, int, int]]:
    """snapshot id -> (pk, chain, generation) for the indexed ones among `ids`."""
    result: dict[str, tuple[int, int, int]] = {}
    for chunk in _batches(list(ids), _CHUNK):
        rows = Snapshot.objects.filter(application=application, snapshot_id__in=chunk)
        for sid, pk, chain, gen in rows.values_list("snapshot_id", "pk", "chain_id", "generation"):
            result[sid] = (pk, chain, gen)
    return result


def _batches(items: Sequence[_T], size: int) -> Iterator[list[_T]]:
    iterator = iter(items)
    while batch := list(islice(iterator, size)):
        yield batch


# -- walking the store ----------------------------------------------------------------------


def _walk_new(
    application: Application,
    repo: Repository,
    starts: Iterable[str],
    *,
    documents_count: int,
    report: ProgressCallback,
) -> tuple[dict[str, Manifest], set[str]]:
    """Manifests reachable from `starts` that are not indexed yet, and ids missing in the store.

    Breadth-first, one frontier at a time: one query asks which frontier ids are indexed, then
    the others' manifests are read (sequentially: parsing and validating holds the GIL, so
    threads only add contention).
    """
    found: dict[str, Manifest] = {}
    missing: set[str] = set()
    known: set[str] = set()

    def read(sid: str) -> Manifest | None:
        try:
            return repo.read_manifest(sid)
        except ObjectNotFoundError:
            return None

    frontier = list(dict.fromkeys(starts))
    # A first (full) index has nothing to stop at: skip asking the database on every step.
    anything_indexed = Snapshot.objects.filter(application=application).exists()
    reported = 0
    while frontier:
        batch = [s for s in frontier if s not in found and s not in known and s not in missing]
        if anything_indexed:
            known |= _indexed_ids(application, batch)
        todo = [s for s in batch if s not in known]
        following: list[str] = []
        for sid, manifest in zip(todo, map(read, todo), strict=True):
            if manifest is None:
                missing.add(sid)
            else:
                found[sid] = manifest
                following.extend(manifest.parents)
        frontier = list(dict.fromkeys(following))
        if len(found) - reported >= 1000 or not frontier:
            reported = len(found)
            report(ReindexProgress("walk", documents_count, reported, 0))
    return found, missing


def _parents_first(
    found: Mapping[str, Manifest], missing: set[str]
) -> tuple[list[tuple[str, Manifest]], list[str]]:
    """`found` ordered parents first (older first among the ready), and the ids left out
    because part of their history is missing from the store."""
    waiting: dict[str, int] = {}
    children: dict[str, list[str]] = {}
    ready: list[tuple[str, str]] = []
    for sid, manifest in found.items():
        inside = [p for p in manifest.parents if p in found]
        waiting[sid] = len(inside)
        for parent in inside:
            children.setdefault(parent, []).append(sid)
        if not inside:
            heapq.heappush(ready, (manifest.created_at, sid))
    broken = {sid for sid, m in found.items() if any(p in missing for p in m.parents)}
    ordered: list[tuple[str, Manifest]] = []
    skipped: list[str] = []
    while ready:
        _, sid = heapq.heappop(ready)
        if sid in broken:
            skipped.append(sid)
        else:
            ordered.append((sid, found[sid]))
        for child in children.get(sid, ()):
            if sid in broken:
                broken.add(child)
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, (found[child].created_at, child))
    return ordered, skipped


# -- refs and reflog ------------------------------------------------------------------------


def _indexed_reflog_seqs(application: Application) -> dict[str, int]:
    """ref -> n such that its reflog entries 1..n are all indexed (0 when there is a gap)."""
    rows = (
        ReflogEntry.objects.filter(application=application)
        .values("ref")
        .annotate(n=models.Count("id"), top=models.Max("seq"))
        .values_list("ref", "n", "top")
    )
    return {ref: top if n == top else 0 for ref, n, top in rows}


REFLOG_COLUMNS = (
    "application_id",
    "ref",
    "seq",
    "old_id",
    "new_id",
    "operation_id",
    "reason",
    "at",
)


def _indexed_seqs(
    application: Application, moves: Mapping[str, Sequence[StoreReflogEntry]]
) -> set[tuple[str, int]]:
    """The (ref, seq) pairs among `moves` that are indexed already."""
    conditions = [
        models.Q(ref=ref, seq__gte=min(e.seq for e in entries)) for ref, entries in moves.items()
    ]
    found: set[tuple[str, int]] = set()
    for chunk in _batches(conditions, 100):
        condition = models.Q()
        for c in chunk:
            condition |= c
        query = ReflogEntry.objects.filter(condition, application=application)
        found.update(query.values_list("ref", "seq"))
    return found


def _split_ref(ref: str) -> tuple[type[Branch] | type[Tag], str]:
    for prefix, model in (("heads/", Branch), ("tags/", Tag)):
        if ref.startswith(prefix) and len(ref) > len(prefix):
            return model, ref[len(prefix) :]
    raise InvalidRefError(ref)


def _apply_ref_moves(
    application: Application, moves: Mapping[str, Sequence[StoreReflogEntry]]
) -> int:
    """Store reflog entries and move branches/tags to their newest entry; returns new entries."""
    moves = {ref: entries for ref, entries in moves.items() if entries}
    split = {ref: _split_ref(ref) for ref in moves}
    newest = {ref: max(entries, key=lambda e: e.seq) for ref, entries in moves.items()}
    targets = _places(application, {e.new for e in newest.values() if e.new is not None})
    for ref, entry in newest.items():
        if entry.new is not None and entry.new not in targets:
            raise UnknownRevisionError(
                application.name,
                entry.new,
                f"{ref} moved there (reflog #{entry.seq}) but it is not indexed; "
                "index the snapshot first or run `manage.py reindex`",
            )
    existing = _indexed_seqs(application, moves)
    rows = [
        (
            application.pk,
            ref,
            e.seq,
            e.old or "",
            e.new or "",
            e.operation_id or "",
            e.reason,
            parse_timestamp(e.at),
        )
        for ref, entries in moves.items()
        for e in {e.seq: e for e in entries}.values()
        if (ref, e.seq) not in existing
    ]
    added = insert_rows(ReflogEntry, REFLOG_COLUMNS, rows)
    for model in (Branch, Tag):
        names = {name: ref for ref, (m, name) in split.items() if m is model}
        if not names:
            continue
        current = {
            obj.name: obj
            for obj in model.objects.filter(application=application, name__in=list(names))
        }
        created, changed = [], []
        for name, ref in names.items():
            entry = newest[ref]
            target = targets[entry.new][0] if entry.new is not None else None
            obj = current.get(name)
            if obj is None:
                obj = model(application=application, name=name, reflog_seq=0)
                created.append(obj)
            elif entry.seq > obj.reflog_seq:
                changed.append(obj)
            else:
                continue
            obj.reflog_seq = entry.seq
            if isinstance(obj, Branch):
                obj.head_id = target
            else:
                obj.target_id = target
        field = "head" if model is Branch else "target"
        model.objects.bulk_create(created, batch_size=_CHUNK)
        model.objects.bulk_update(changed, [field, "reflog_seq"], batch_size=_CHUNK)
    return added
