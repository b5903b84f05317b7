"""Epoch alignment of a downstream job to its upstream branch
(van Kaam, "Epoch alignment in stateful streams").

The protocol state lives where live operations reach a running job: the downstream branch's
control document, key ``alignment``. The control plane (the ``align`` operation) writes
commands; the engine applies them at epoch boundaries; the sync state is derived from what
the store says (the downstream's offsets against the upstream's committed epochs), so it is
restore-consistent and a crashed coordinator loses nothing.

    unaligned --catch_up--> catching_up --(lag <= 1)--> ready --align(E)--> aligned
    abort: from any state back to unaligned

- ``{"command": "catch_up"}``: read every committed upstream epoch not read yet (as
  unaligned); the source is **ready** once it has read at least the second-last committed
  upstream epoch (lag <= 1).
- ``{"command": "align", "from_epoch": E}``: from downstream epoch E on, each downstream
  epoch reads exactly one upstream epoch (the next), so downstream and upstream epoch
  boundaries coincide: downstream epoch m holds exactly the records of upstream epoch
  mapping(m) = mapping(m-1) + 1. Accepted only from ready; E is in the future.
- ``{"command": "abort"}``: back to unaligned; only epoch boundaries change, never the set
  of records read (every upstream epoch is read once either way).

Commands that do not fit the current state, or arrive while another transition is pending
(an align whose E has not committed yet), are refused with `AlignmentError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runners.engine.branch_source import (
    ALIGNMENT,
    BranchOutputSource,
    consumed,
    mapping_of,
    upstream_epochs,
)
from snapshots_store import Repository

COMMANDS = ("catch_up", "align", "abort")
#: epochs ahead of the downstream head at which `align` takes effect by default
SYNCHRONIZE_AFTER = 2


class AlignmentError(ValueError):
    """A command that does not fit the alignment state."""


@dataclass(frozen=True)
class AlignmentStatus:
    """Where a downstream source stands against its upstream branch."""

    state: str  # unaligned | catching_up | ready | aligned
    downstream_epoch: int
    consumed_epoch: int
    upstream_epoch: int
    lag: int
    from_epoch: int | None = None
    pending: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "downstream_epoch": self.downstream_epoch,
            "consumed_epoch": self.consumed_epoch,
            "upstream_epoch": self.upstream_epoch,
            "lag": self.lag,
            "from_epoch": self.from_epoch,
            "pending": self.pending,
        }


def alignment_status(
    repo: Repository, branch: str, source: BranchOutputSource, control: Mapping[str, Any]
) -> AlignmentStatus:
    """The sync state of `branch`'s source (see the module docstring), from the store."""
    head = repo.read_ref(f"heads/{branch}")
    manifest = None if head is None else repo.read_manifest(head.target)
    mine = 0 if manifest is None else manifest.epoch
    read = 0 if manifest is None else consumed(manifest, source.name)[0]
    ups = upstream_epochs(source.repo(), source.branch)
    latest = ups[-1].epoch if ups else 0
    second_last = ups[-2].epoch if len(ups) >= 2 else 0
    lag = sum(1 for e in ups if e.epoch > read)
    doc = control.get(ALIGNMENT)
    command = doc.get("command") if isinstance(doc, Mapping) else None
    state, start, pending = "unaligned", None, False
    if command == "align":
        assert isinstance(doc, Mapping)
        start = int(doc.get("from_epoch", 0))
        done = manifest is not None and mine >= start and _aligned_head(repo, branch, source)
        state, pending = ("aligned" if done else "ready"), not done
    elif command == "catch_up":
        state = "ready" if read >= second_last else "catching_up"
    return AlignmentStatus(
        state,
        downstream_epoch=mine,
        consumed_epoch=read,
        upstream_epoch=latest,
        lag=lag,
        from_epoch=start,
        pending=pending,
    )


def _aligned_head(repo: Repository, branch: str, source: BranchOutputSource) -> bool:
    """Whether the newest epoch on `branch` read its upstream in aligned mode."""
    for sid, manifest in repo.log(f"heads/{branch}", first_parent=True):
        entries = [e for e in mapping_of(sid, manifest) if e.source == source.name]
        if entries:
            return entries[0].aligned
        if manifest.outputs:
            return False
    return False


def command_document(
    status: AlignmentStatus, command: str, *, from_epoch: int | None = None
) -> dict[str, Any]:
    """The control document's new ``alignment`` value for `command`, or AlignmentError."""
    if command not in COMMANDS:
        raise AlignmentError(f"unknown alignment command {command!r}; one of {COMMANDS}")
    if command == "abort":
        return {"command": "abort"}
    if status.pending:
        raise AlignmentError(
            f"an align at epoch {status.from_epoch} is still pending; wait for it or abort"
        )
    if command == "catch_up":
        if status.state != "unaligned":
            raise AlignmentError(f"catch_up is accepted only when unaligned, not {status.state}")
        return {"command": "catch_up"}
    if status.state != "ready":
        raise AlignmentError(f"align is accepted only when ready, not {status.state}")
    start = status.downstream_epoch + SYNCHRONIZE_AFTER if from_epoch is None else from_epoch
    if start <= status.downstream_epoch:
        raise AlignmentError(
            f"align from epoch {start}: the downstream has committed epoch "
            f"{status.downstream_epoch} already; pick a future epoch"
        )
    return {"command": "align", "from_epoch": start}


def send_command(
    repo: Repository,
    branch: str,
    source: BranchOutputSource,
    command: str,
    *,
    from_epoch: int | None = None,
) -> dict[str, Any]:
    """Validate `command` against the current state and write it into the control document
    (compare-and-swap; AlignmentError or ControlConflictError)."""
    control, version = repo.read_control(branch)
    status = alignment_status(repo, branch, source, control)
    doc = command_document(status, command, from_epoch=from_epoch)
    if control.get(ALIGNMENT) == doc:
        return doc
    repo.write_control(branch, {**control, ALIGNMENT: doc}, version)
    return doc


__all__ = [
    "COMMANDS",
    "AlignmentError",
    "AlignmentStatus",
    "alignment_status",
    "command_document",
    "send_command",
]
