"""A branch's versioned output as another job's source (job webs, see docs/webs.md).

`BranchOutputSource(store_url, namespace, branch)` reads the records an upstream job
committed on a branch. Its unit is the **upstream epoch**: a commit on the branch's
first-parent chain that processed input (its epoch number is above its first parent's;
rollback, fork, rescale and migration commits carry no records and are skipped). One
downstream epoch reads the records of whole upstream epochs only — never a part of one,
never an uncommitted one (only commits reachable from the branch ref are read), never one
twice (the offsets say which was read last).

Offsets (partition -> int, as every source):

- ``"epoch"``: the upstream epoch number read last (0: none yet);
- ``"snapshot"``: a fingerprint of that upstream commit's snapshot id (its first 15 hex
  digits as an integer, 0: none).

Epoch numbers repeat after an upstream rollback (the rollback commit keeps the old epoch
number and the next epoch takes the following one), so the fingerprint is what tells that
the upstream commit read last is no longer on the upstream branch: `plan` then raises
`UpstreamRewoundError` naming the newest downstream snapshot that is still consistent, and
`retained` reports it, instead of silently reading a different history.

Each downstream manifest records the mapping in ``extra["inputs"][<source name>]``:
store, namespace, branch, and ``epochs`` / ``snapshots`` (the upstream epochs read and
their snapshot ids, in order) — see `epoch_mapping`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from runners.engine.eventtime.watermark import EXTRA as EVENT_TIME_EXTRA
from runners.engine.output import EPOCH, _manifest_tables
from runners.engine.repos import repository
from runners.engine.sources import Split, SplitData
from snapshots_store import Manifest, Repository

EPOCH_PARTITION = "epoch"
SNAPSHOT_PARTITION = "snapshot"
INPUTS = "inputs"
ALIGNMENT = "alignment"
#: alignment states of a downstream source
#: (van Kaam, "Epoch alignment in stateful streams")
ALIGNMENT_STATES = ("unaligned", "catching_up", "ready", "aligned")


class UpstreamRewoundError(RuntimeError):
    """The upstream commit a downstream snapshot read last is no longer on the upstream
    branch (the upstream was rolled back): the downstream must be rolled back first."""

    def __init__(self, message: str, epoch: int) -> None:
        super().__init__(message)
        self.epoch = epoch


def fingerprint(snapshot_id: str) -> int:
    """The offset that identifies an upstream snapshot: its first 15 hex digits (60 bits)."""
    return int(snapshot_id[:15], 16)


@dataclass(frozen=True)
class UpstreamEpoch:
    """One upstream commit that processed input."""

    epoch: int
    snapshot_id: str
    manifest: Manifest


def upstream_epochs(repo: Repository, branch: str) -> list[UpstreamEpoch]:
    """The epochs on the first-parent chain of `branch`, oldest first ([] without a branch).

    A commit counts when its epoch number is above its first parent's (or it has no parent
    and epoch >= 1): those are the commits that processed input and may carry records."""
    if repo.read_ref(f"heads/{branch}") is None:
        return []
    chain = list(repo.log(f"heads/{branch}", first_parent=True))
    chain.reverse()
    epochs: list[UpstreamEpoch] = []
    previous = 0
    for sid, manifest in chain:
        if manifest.epoch > previous:
            epochs.append(UpstreamEpoch(manifest.epoch, sid, manifest))
        previous = manifest.epoch
    return epochs


_TYPES = {"string": pa.string(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_()}


@dataclass
class BranchOutputSource:
    """The committed output of `branch` in the store at `store_url` / `namespace`.

    `max_epochs_per_epoch` caps how many upstream epochs one downstream epoch reads (None:
    every committed one not read yet). An upstream epoch without records is read as an
    empty table with the columns of other records of the branch (or of `schema`). In aligned
    mode (the control document's ``alignment``, applied by the runner through
    `prepare_epoch`) a downstream epoch reads exactly one upstream epoch. `epoch_column`
    adds the upstream epoch number as a column.
    """

    store_url: str
    namespace: str
    branch: str = "main"
    name: str = "upstream"
    max_epochs_per_epoch: int | None = None
    epoch_column: str | None = None
    #: column -> type (string, int64, float64, bool) of an upstream that has no records yet
    schema: Mapping[str, str] | None = None
    #: set on the driver for the epoch being planned (see `prepare_epoch`)
    aligned: bool = field(default=False, compare=False)
    #: a hot-swap re-pointed this source (control document ``repoint.<name>``, see
    #: `prepare_epoch`): read `branch` up to ``at_epoch``, ``to_branch`` after it
    repoint: Mapping[str, Any] | None = field(default=None, compare=False)

    def _branches(self, committed: Mapping[str, int]) -> tuple[str, int | None, str | None]:
        """(branch to read now, the last epoch it may give or None, the branch the epoch read
        last lives on when it is another one)."""
        point = self.repoint
        if point is None:
            return self.branch, None, None
        at = int(point["at_epoch"])
        if int(committed.get(EPOCH_PARTITION, 0)) < at:
            return self.branch, at, None  # never read past the swap epoch on the old branch
        return str(point["to_branch"]), None, self.branch

    def repo(self) -> Repository:
        return repository(self.store_url, self.namespace)

    def describe(self) -> str:
        return f"branch {self.branch!r} of {self.namespace!r}"

    # -- Source protocol -------------------------------------------------------------------

    def _position(
        self, epochs: Sequence[UpstreamEpoch], committed: Mapping[str, int]
    ) -> tuple[int, str | None]:
        """(index in `epochs` after the epoch read last, problem or None)."""
        n = int(committed.get(EPOCH_PARTITION, 0))
        if n <= 0:
            return 0, None
        fp = int(committed.get(SNAPSHOT_PARTITION, 0))
        for i, e in enumerate(epochs):
            if e.epoch == n:
                if fingerprint(e.snapshot_id) == fp:
                    return i + 1, None
                return i + 1, (
                    f"upstream {self.describe()} was rolled back: its epoch {n} is now snapshot "
                    f"{e.snapshot_id[:12]}, not the one read (fingerprint {fp:015x}); roll this "
                    "job back to its newest snapshot that read only upstream commits still on "
                    "the branch (rewind_point)"
                )
        return len(epochs), (
            f"upstream {self.describe()} has no epoch {n} on its branch any more (it was "
            "rolled back or deleted); roll this job back to its newest snapshot that read "
            "only upstream commits still on the branch (rewind_point)"
        )

    def _start(self, committed: Mapping[str, int]) -> tuple[list[UpstreamEpoch], int, int | None]:
        """The upstream epochs of the branch to read now, the index after the one read last,
        and the last epoch that may be read (a re-point's swap epoch, else None)."""
        branch, until, previous_branch = self._branches(committed)
        epochs = upstream_epochs(self.repo(), branch)
        start, problem = self._position(epochs, committed)
        if problem is not None and previous_branch is not None:
            # just re-pointed: the epoch read last is the old job's, on the old branch
            _, old_problem = self._position(
                upstream_epochs(self.repo(), previous_branch), committed
            )
            if old_problem is None:
                n = int(committed.get(EPOCH_PARTITION, 0))
                start, problem = sum(1 for e in epochs if e.epoch <= n), None
        if problem is not None:
            raise UpstreamRewoundError(problem, int(committed.get(EPOCH_PARTITION, 0)))
        return epochs, start, until

    def plan(self, committed: Mapping[str, int]) -> list[Split]:
        epochs, start, until = self._start(committed)
        limit = 1 if self.aligned else self.max_epochs_per_epoch
        chosen = epochs[start:] if limit is None else epochs[start : start + limit]
        if until is not None:
            chosen = [e for e in chosen if e.epoch <= until]
        previous = int(committed.get(EPOCH_PARTITION, 0))
        splits = []
        for e in chosen:
            splits.append(Split(self.name, EPOCH_PARTITION, previous, e.epoch, e.snapshot_id))
            previous = e.epoch
        return splits

    def read(self, split: Split) -> SplitData:
        repo = self.repo()
        manifest = repo.read_manifest(split.locator)
        tables = list(_manifest_tables(repo, manifest.outputs, manifest.epoch, "records"))
        if tables:
            table = pa.concat_tables(tables, promote_options="permissive").drop_columns([EPOCH])
        else:
            table = self._empty(repo, split.locator)
        if self.epoch_column is not None:
            column = pa.array([manifest.epoch] * table.num_rows, pa.int64())
            table = table.append_column(self.epoch_column, column)
        return SplitData(table)

    def _empty(self, repo: Repository, snapshot_id: str) -> pa.Table:
        """No records: an empty table with the columns of the nearest earlier records, else
        of any records on the branch, else of the declared `schema` (else no columns)."""
        starts = [snapshot_id]
        head = repo.read_ref(f"heads/{self.branch}")
        if head is None and self.repoint is not None:
            head = repo.read_ref(f"heads/{self.repoint['to_branch']}")
        if head is not None:
            starts.append(head.target)
        for start in starts:
            for _, manifest in repo.log(start, first_parent=True):
                for table in _manifest_tables(repo, manifest.outputs, manifest.epoch, "records"):
                    return table.drop_columns([EPOCH]).slice(0, 0)
        if self.schema:
            return pa.schema([(k, _TYPES[v]) for k, v in self.schema.items()]).empty_table()
        return pa.table({})

    def retained(self, offsets: Mapping[str, int]) -> str | None:
        """None while the upstream commit read last is still on the upstream branch."""
        try:
            self._start(offsets)
        except UpstreamRewoundError as exc:
            return str(exc)
        return None

    # -- hooks the runner calls (optional for sources) ------------------------------------

    def prepare_epoch(self, control: Mapping[str, Any], epoch: int) -> None:
        """Before planning downstream epoch `epoch`: aligned mode is on when the control
        document's ``alignment`` is an ``align`` command from an epoch <= `epoch`; a hot-swap
        re-points the source when ``repoint.<name>`` names its branch (`hotswap.py`)."""
        self.aligned = alignment_applies(control, epoch)
        points = control.get("repoint")
        point = points.get(self.name) if isinstance(points, Mapping) else None
        self.repoint = (
            point
            if isinstance(point, Mapping)
            and point.get("from_branch") == self.branch
            and point.get("namespace") == self.namespace
            and isinstance(point.get("at_epoch"), int)
            else None
        )

    def end_offsets(self, committed: Mapping[str, int], splits: Sequence[Split]) -> dict[str, int]:
        if not splits:
            return dict(committed)
        last = splits[-1]
        return {EPOCH_PARTITION: last.end, SNAPSHOT_PARTITION: fingerprint(last.locator)}

    def upstream_watermarks(self, splits: Sequence[Split]) -> dict[str, dict[str, Any]]:
        """The watermark the newest upstream epoch read recorded (`PropagatesWatermarks`):
        ``{name: {"watermark", "epoch"}}``, empty when nothing was read or the upstream has
        no event time."""
        if not splits:
            return {}
        newest = self.repo().read_manifest(splits[-1].locator)
        doc = newest.extra.get(EVENT_TIME_EXTRA)
        if not isinstance(doc, Mapping):
            return {}
        return {self.name: {"watermark": doc.get("watermark"), "epoch": newest.epoch}}

    def lineage(self, committed: Mapping[str, int], splits: Sequence[Split]) -> dict[str, Any]:
        """What the downstream manifest records of this epoch's input (``extra.inputs``)."""
        return {
            "kind": "branch_output",
            "store": self.store_url,
            "namespace": self.namespace,
            "branch": self._branches(committed)[0],
            "after_epoch": int(committed.get(EPOCH_PARTITION, 0)),
            "epochs": [s.end for s in splits],
            "snapshots": [s.locator for s in splits],
            "aligned": self.aligned,
        }


def alignment_applies(control: Mapping[str, Any], epoch: int) -> bool:
    """Whether the control document puts downstream epoch `epoch` in aligned mode."""
    doc = control.get(ALIGNMENT)
    if not isinstance(doc, Mapping) or doc.get("command") != "align":
        return False
    start = doc.get("from_epoch", 0)
    return isinstance(start, int) and epoch >= start


# -- reading the mapping back ----------------------------------------------------------------


@dataclass(frozen=True)
class MappingEntry:
    """Downstream epoch -> the upstream epochs (and snapshots) it read."""

    epoch: int
    snapshot_id: str
    source: str
    namespace: str
    branch: str
    upstream_epochs: tuple[int, ...]
    upstream_snapshots: tuple[str, ...]
    aligned: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "snapshot_id": self.snapshot_id,
            "source": self.source,
            "namespace": self.namespace,
            "branch": self.branch,
            "upstream_epochs": list(self.upstream_epochs),
            "upstream_snapshots": list(self.upstream_snapshots),
            "aligned": self.aligned,
        }


def mapping_of(snapshot_id: str, manifest: Manifest) -> list[MappingEntry]:
    """The mapping entries one manifest records (one per branch-output source)."""
    inputs = manifest.extra.get(INPUTS)
    if not isinstance(inputs, dict):
        return []
    entries = []
    for source, doc in sorted(inputs.items()):
        if not isinstance(doc, dict) or doc.get("kind") != "branch_output":
            continue
        entries.append(
            MappingEntry(
                epoch=manifest.epoch,
                snapshot_id=snapshot_id,
                source=source,
                namespace=str(doc.get("namespace")),
                branch=str(doc.get("branch")),
                upstream_epochs=tuple(int(e) for e in doc.get("epochs", [])),
                upstream_snapshots=tuple(str(s) for s in doc.get("snapshots", [])),
                aligned=bool(doc.get("aligned", False)),
            )
        )
    return entries


def epoch_mapping(repo: Repository, branch: str) -> list[MappingEntry]:
    """Downstream epoch -> upstream epochs, for every epoch on the first-parent chain of
    `branch`, oldest first."""
    if repo.read_ref(f"heads/{branch}") is None:
        return []
    chain = list(repo.log(f"heads/{branch}", first_parent=True))
    chain.reverse()
    return [entry for sid, m in chain for entry in mapping_of(sid, m)]


def consumed(manifest: Manifest, source: str) -> tuple[int, int]:
    """(upstream epoch read last, its fingerprint) at a downstream snapshot."""
    offsets = manifest.offsets.get(source, {})
    return int(offsets.get(EPOCH_PARTITION, 0)), int(offsets.get(SNAPSHOT_PARTITION, 0))


def upstream_epoch_at(repo: Repository, branch: str, epoch: int, source: str) -> int:
    """The upstream epoch that downstream epoch `epoch` (on `branch`'s first-parent chain)
    had read up to — the translation of "as of my epoch m" (0: nothing read yet).
    KeyError when the branch has no such epoch."""
    for _, manifest in repo.log(f"heads/{branch}", first_parent=True):
        if manifest.epoch == epoch:
            return consumed(manifest, source)[0]
        if manifest.epoch < epoch:
            break
    raise KeyError(f"branch {branch!r} has no epoch {epoch}")


def rewind_point(repo: Repository, branch: str, source: BranchOutputSource) -> str | None:
    """The newest snapshot on `branch`'s first-parent chain whose input is still on the
    upstream branch (None: the branch does not exist). Everything after it read upstream
    commits that a rollback abandoned; the head itself when nothing did."""
    if repo.read_ref(f"heads/{branch}") is None:
        return None
    epochs = upstream_epochs(source.repo(), source.branch)
    last = None
    for sid, manifest in repo.log(f"heads/{branch}", first_parent=True):
        last = sid
        if source._position(epochs, manifest.offsets.get(source.name, {}))[1] is None:
            return sid
    return last


def rewind(
    repo: Repository,
    branch: str,
    source: BranchOutputSource,
    *,
    operation_id: str | None = None,
) -> str | None:
    """After an upstream rollback: roll `branch` back to `rewind_point` (a rollback commit;
    the abandoned commits stay in the reflog) so the next epochs re-derive the mapping from
    the upstream's new history. Returns the new head, or None when nothing was invalid."""
    from runners.engine.state_ops import new_branch_commit

    head = repo.read_ref(f"heads/{branch}")
    point = rewind_point(repo, branch, source)
    if head is None or point is None or point == head.target:
        return None
    return new_branch_commit(
        repo,
        point,
        branch,
        kind="rollback",
        operation_id=operation_id,
        provenance={
            "reason": f"upstream {source.describe()} was rolled back",
            "upstream_branch": source.branch,
            "upstream_namespace": source.namespace,
        },
        expected_head=head.target,
    )


__all__ = [
    "ALIGNMENT",
    "ALIGNMENT_STATES",
    "BranchOutputSource",
    "MappingEntry",
    "UpstreamEpoch",
    "UpstreamRewoundError",
    "alignment_applies",
    "consumed",
    "epoch_mapping",
    "fingerprint",
    "mapping_of",
    "rewind",
    "rewind_point",
    "upstream_epoch_at",
    "upstream_epochs",
]
