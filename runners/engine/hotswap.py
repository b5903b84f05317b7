"""Hot-swap: replace a running job by a new version at a swap epoch S, exactly once
(van Kaam, "Epoch alignment in stateful streams"; see docs/webs.md).

The new job N runs beside the old job O with the same epoch boundaries (N is a fork of O —
the fork keeps O's epoch numbers and offsets — reading the same input, in aligned mode when
it reads a branch output), so epoch e of both holds the same input. A coordinator (the
``hotswap`` operation) delivers S to both jobs through a **two-step commit** in their
control documents, key ``swap``:

1. ``phase: "prepared"`` with S, the job's ``role`` (old / new) and its partner's location.
   Each job acknowledges in the manifest of every epoch it commits from then on
   (``extra.swap``). Until the commit arrives, O never runs an epoch after S and N never
   emits: O holds before epoch S+1, N voids its output (commits state, no outputs).
2. ``phase: "committed"``, once both jobs acknowledged the prepare in a committed epoch.
   From then on N is the only writer after S: O never runs an epoch after S (its runner
   stops with a ``retired:`` reason, the process exits and the coordinator retires the
   job), and N emits from epoch S+1 — after waiting until O has committed epoch S (the new
   job, starting the epoch after S, waits until the old job has completed S).
3. Downstream jobs reading O's branch output are **re-pointed** (`repoint_downstream`, the
   control document's ``repoint`` key): they read O's epochs up to S — never one after — and
   continue with N's epochs from S+1 on N's branch, so no epoch is lost or read twice.

Every epoch's results therefore reach the output from exactly one job: O's for epochs <= S,
N's for epochs > S (`swap_output`). The protocol state lives in the control documents and
the manifests, so it survives a crash of either job (or of the coordinator) at any point:
a restarted job reads its control document and goes on. ``phase: "aborted"`` (before the
commit) lets O emit again and keeps N voided.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from runners.engine.output import EPOCH, _manifest_tables, _union
from snapshots_store import Repository

SWAP = "swap"
PHASES = ("prepared", "committed", "aborted")
HOLD = "swap:"  # prefix of a runner's stopped_reason while it holds for the swap
RETIRED = "retired:"  # prefix of the old job's stopped_reason after the swap: it exits
REPOINT = "repoint"  # control document key of a downstream re-pointed to the new job


class SwapError(ValueError):
    """A swap request that cannot be honoured."""


@dataclass(frozen=True)
class SwapGate:
    """What the swap protocol says about one epoch of one job."""

    emit: bool
    hold: str | None
    record: dict[str, Any] | None


def swap_gate(control: Mapping[str, Any], epoch: int, partner_epoch: Callable[[], int]) -> SwapGate:
    """Whether epoch `epoch` may run (`hold`) and emit its output (`emit`), and what its
    manifest records (``extra.swap``). `partner_epoch` reads the partner's committed epoch."""
    doc = control.get(SWAP)
    if not isinstance(doc, Mapping):
        return SwapGate(True, None, None)
    role, phase, s = doc.get("role"), doc.get("phase"), doc.get("swap_epoch")
    if role not in ("old", "new") or phase not in PHASES or not isinstance(s, int):
        raise SwapError(f"malformed swap document in the control document: {dict(doc)}")
    record = {"id": str(doc.get("id", "")), "role": role, "phase": phase, "swap_epoch": s}
    if phase == "aborted":
        emit = role == "old"
        return SwapGate(emit, None, {**record, "voided": not emit})
    if role == "old":
        if epoch <= s:
            return SwapGate(True, None, {**record, "voided": False})
        if phase == "prepared":
            return SwapGate(False, f"{HOLD} epoch {epoch} is after swap epoch {s}: waiting "
                            "for the swap commit", record)  # fmt: skip
        # committed: the new job is the only writer after S; this job is retired at S
        return SwapGate(False, f"{RETIRED} swapped for the new version at epoch {s}", record)
    if epoch <= s:
        return SwapGate(False, None, {**record, "voided": True})
    if phase == "prepared":
        return SwapGate(False, f"{HOLD} epoch {epoch} is after swap epoch {s}: waiting for "
                        "the swap commit", record)  # fmt: skip
    have = partner_epoch()
    if have < s:
        return SwapGate(False, f"{HOLD} waiting for the old job to commit epoch {s} (it has "
                        f"{have})", record)  # fmt: skip
    return SwapGate(True, None, {**record, "voided": False})


def partner_reader(control: Mapping[str, Any]) -> Callable[[], int]:
    """A function returning the swap partner's committed epoch (0 without a partner)."""

    def read() -> int:
        doc = control.get(SWAP)
        partner = doc.get("partner") if isinstance(doc, Mapping) else None
        if not isinstance(partner, Mapping):
            return 0
        repo = Repository.open(str(partner["store"]), str(partner["namespace"]))
        head = repo.read_ref(f"heads/{partner['branch']}")
        return 0 if head is None else repo.read_manifest(head.target).epoch

    return read


# -- the coordinator's side ------------------------------------------------------------------


@dataclass(frozen=True)
class SwapSide:
    """One job of a swap: where its branch lives."""

    store: str
    namespace: str
    branch: str

    def repo(self) -> Repository:
        return Repository.open(self.store, self.namespace)

    def to_dict(self) -> dict[str, str]:
        return {"store": self.store, "namespace": self.namespace, "branch": self.branch}


def head_epoch(side: SwapSide) -> int:
    repo = side.repo()
    head = repo.read_ref(f"heads/{side.branch}")
    return 0 if head is None else repo.read_manifest(head.target).epoch


def check_swappable(old: SwapSide, new: SwapSide) -> None:
    """N must share O's epoch numbering and input: a fork of O's history (same store and
    namespace, a common ancestor)."""
    if (old.store, old.namespace) != (new.store, new.namespace):
        raise SwapError(
            "the new job must be a fork of the old job's branch in the same application "
            "(store and namespace), so that both number epochs and read input alike"
        )
    repo = old.repo()
    for side in (old, new):
        if repo.read_ref(f"heads/{side.branch}") is None:
            raise SwapError(f"branch {side.branch!r} has no commits yet")
    if repo.merge_base(f"heads/{old.branch}", f"heads/{new.branch}") is None:
        raise SwapError(
            f"branch {new.branch!r} does not share history with {old.branch!r}: fork the new "
            "version from the old job's branch"
        )
    shared = repo.ancestors(f"heads/{old.branch}")
    for sid, manifest in repo.log(f"heads/{new.branch}", first_parent=True):
        if sid in shared:
            break
        record = manifest.extra.get(SWAP)
        voided = isinstance(record, dict) and bool(record.get("voided"))
        if manifest.outputs and not voided:
            raise SwapError(
                f"branch {new.branch!r} emitted output in its epoch {manifest.epoch} after the "
                "fork: the swap could not deliver each epoch from one job only; fork again "
                "and start the new job after the swap is prepared"
            )


def _write(side: SwapSide, doc: Mapping[str, Any] | None) -> None:
    repo = side.repo()
    for _ in range(20):
        control, version = repo.read_control(side.branch)
        new = dict(control)
        if doc is None:
            new.pop(SWAP, None)
        else:
            new[SWAP] = dict(doc)
        if new == control:
            return
        try:
            repo.write_control(side.branch, new, version)
            return
        except Exception:  # a concurrent writer: re-read and retry
            continue
    raise SwapError(f"the control document of {side.branch!r} kept changing")


def send_phase(swap_id: str, old: SwapSide, new: SwapSide, swap_epoch: int, phase: str) -> None:
    """Write `phase` of swap `swap_id` at `swap_epoch` into both control documents
    (idempotent: a retry writes the same documents)."""
    if phase not in PHASES:
        raise SwapError(f"phase must be one of {PHASES}")
    for role, side, partner in (("old", old, new), ("new", new, old)):
        current = side.repo().read_control(side.branch)[0].get(SWAP)
        if (
            isinstance(current, Mapping)
            and current.get("id") == swap_id
            and PHASES.index(str(current.get("phase"))) > PHASES.index(phase)
        ):
            continue  # never move a swap backwards (a retried earlier phase)
        _write(
            side,
            {
                "id": swap_id,
                "role": role,
                "phase": phase,
                "swap_epoch": swap_epoch,
                "partner": partner.to_dict(),
            },
        )


def acknowledged(side: SwapSide, swap_id: str, phase: str) -> int | None:
    """The newest epoch of `side` whose manifest acknowledged `phase` of swap `swap_id`."""
    repo = side.repo()
    if repo.read_ref(f"heads/{side.branch}") is None:
        return None
    for _, manifest in repo.log(f"heads/{side.branch}", first_parent=True, limit=500):
        record = manifest.extra.get(SWAP)
        if isinstance(record, dict) and record.get("id") == swap_id:
            if PHASES.index(str(record.get("phase"))) >= PHASES.index(phase):
                return manifest.epoch
            return None
    return None


def swapped(old: SwapSide, new: SwapSide, swap_id: str, swap_epoch: int) -> bool:
    """The swap is done: O committed epoch S, N committed an emitting epoch after S."""
    if head_epoch(old) < swap_epoch:
        return False
    repo = new.repo()
    for _, manifest in repo.log(f"heads/{new.branch}", first_parent=True, limit=500):
        record = manifest.extra.get(SWAP)
        if (
            isinstance(record, dict)
            and record.get("id") == swap_id
            and record.get("phase") == "committed"
            and manifest.epoch > swap_epoch
            and not record.get("voided")
        ):
            return True
    return False


def swap_output(old: SwapSide, new: SwapSide) -> pa.Table:
    """The output of the pair: O's emitted epochs and N's emitted epochs after their common
    history, with a ``_job`` column ("old"/"new") — each epoch from exactly one job."""
    repo_old, repo_new = old.repo(), new.repo()
    shared = repo_old.ancestors(f"heads/{old.branch}")
    tables = []
    for role, repo, branch in (("old", repo_old, old.branch), ("new", repo_new, new.branch)):
        chain = list(repo.log(f"heads/{branch}", first_parent=True))
        for sid, manifest in reversed(chain):
            if role == "new" and sid in shared:
                continue
            for table in _manifest_tables(repo, manifest.outputs, manifest.epoch, "records"):
                tables.append(table.append_column("_job", pa.array([role] * table.num_rows)))
    return _union(tables, pa.schema([(EPOCH, pa.int64()), ("_job", pa.string())]))


def repoint_downstream(
    downstream: SwapSide, source: str, old: SwapSide, new: SwapSide, swap_epoch: int, swap_id: str
) -> None:
    """Tell the downstream job on `downstream` that its branch-output source `source` reads
    `old`'s branch up to `swap_epoch` and `new`'s after it (idempotent; the control
    document's ``repoint.<source>``)."""
    if (old.store, old.namespace) != (new.store, new.namespace):
        raise SwapError("old and new job must share store and namespace to re-point readers")
    repo = downstream.repo()
    doc = {
        "id": swap_id,
        "namespace": old.namespace,
        "from_branch": old.branch,
        "to_branch": new.branch,
        "at_epoch": swap_epoch,
    }
    for _ in range(20):
        control, version = repo.read_control(downstream.branch)
        current = control.get(REPOINT)
        points = dict(current) if isinstance(current, Mapping) else {}
        if points.get(source) == doc:
            return
        points[source] = doc
        try:
            repo.write_control(downstream.branch, {**control, REPOINT: points}, version)
            return
        except Exception:  # a concurrent writer: re-read and retry
            continue
    raise SwapError(f"the control document of {downstream.branch!r} kept changing")


__all__ = [
    "HOLD",
    "PHASES",
    "REPOINT",
    "RETIRED",
    "SWAP",
    "SwapError",
    "SwapGate",
    "SwapSide",
    "acknowledged",
    "check_swappable",
    "head_epoch",
    "partner_reader",
    "repoint_downstream",
    "send_phase",
    "swap_gate",
    "swap_output",
    "swapped",
]
