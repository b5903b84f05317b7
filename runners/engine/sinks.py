"""Sinks: the second phase of the epoch commit, into places outside the store.

The epoch commit is the first phase of a two-phase commit: an epoch's output is written into
the store and made visible by the compare-and-swap of the branch ref. A sink adds the second
phase for a destination (a Kafka topic; later Delta, Iceberg, PostgreSQL tables):

1. ``prepare(output)`` — during the epoch, after its tasks and before the snapshot's CAS —
   stages the epoch's output where the destination's readers cannot see it yet (a Kafka
   transaction left open) and returns the *pending record*: a JSON object saying what was
   staged under which ids. The runner keeps it in the snapshot's manifest
   (``extra.sinks.<sink name>``, with the parts of the output it covers).
2. The CAS commits the snapshot, pending record included.
3. ``commit(output, pending)`` makes the staged output visible, idempotently: a second call,
   or a call in a new process that finds only the pending record in the branch head (a crash
   between the CAS and the sink's commit, or inside it), repeats only what the destination
   does not hold yet and never shows an epoch twice.
4. ``committed(pending)`` says which epoch (and snapshot) of this branch the destination holds
   among what the pending record names; the runner asks it when it starts, before its first
   epoch, and finishes the head's second phase if the destination lacks it.

An epoch's output is cut into *parts*, one per task (its key-group range), so a destination
can stage each part on its own (one Kafka transaction per part) and a restart at another
parallelism still finds the parts the pending record names. A part is read back from the store
(`EpochOutput.tables`): what a sink publishes is a function of the snapshot, so repeating the
second phase publishes the same records.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from snapshots_store import Repository

SINKS = "sinks"  # the manifest's extra key holding each sink's pending record


@dataclass(frozen=True)
class OutputPart:
    """The output of one task: its key groups ``first .. last`` and its output objects."""

    first_key_group: int
    last_key_group: int
    outputs: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"key_groups": [self.first_key_group, self.last_key_group],
                "outputs": list(self.outputs)}  # fmt: skip

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> OutputPart:
        first, last = doc["key_groups"]
        return cls(int(first), int(last), tuple(str(o) for o in doc["outputs"]))


@dataclass(frozen=True)
class EpochOutput:
    """What a sink publishes for one epoch of one branch."""

    repo: Repository = field(repr=False)
    namespace: str
    branch: str
    epoch: int
    key: tuple[str, ...]
    parts: tuple[OutputPart, ...]
    #: the snapshot that commits the epoch; None while it is prepared (before the CAS)
    snapshot_id: str | None = None
    #: the crash-test spec (crash.py), so a sink can be killed inside its commit
    crash: tuple[str, int] | None = field(default=None, repr=False)

    def tables(self, part: OutputPart) -> Iterator[pa.Table]:
        """The part's output rows (record outputs only, no dead letters), in stored order."""
        from runners.engine.output import EPOCH, _manifest_tables

        for table in _manifest_tables(self.repo, part.outputs, self.epoch, "records"):
            yield table.drop_columns([EPOCH])

    def committing(self, snapshot_id: str) -> EpochOutput:
        """The same output, committed by `snapshot_id`."""
        return EpochOutput(self.repo, self.namespace, self.branch, self.epoch, self.key,
                           self.parts, snapshot_id, self.crash)  # fmt: skip

    def pending(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """The manifest's entry for a sink: the epoch, the parts and the sink's own record."""
        return {"epoch": self.epoch, "parts": [p.to_json() for p in self.parts],
                "staged": dict(record)}  # fmt: skip


@dataclass(frozen=True)
class Held:
    """An epoch of the branch the destination holds, and the snapshot that committed it."""

    epoch: int
    snapshot_id: str


@runtime_checkable
class Sink(Protocol):
    """What the engine needs from a sink (see the module docstring and docs/engine.md)."""

    name: str

    def prepare(self, output: EpochOutput) -> dict[str, Any]:
        """Stage the epoch's output unseen by readers; the JSON record of what was staged."""
        ...

    def commit(self, output: EpochOutput, pending: Mapping[str, Any]) -> None:
        """Make the staged epoch visible, idempotently (after the CAS; maybe in a new
        process with only `pending`, the sink's record from the manifest)."""
        ...

    def committed(self, pending: Mapping[str, Any]) -> Held | None:
        """The latest epoch the destination holds entirely among what `pending` names."""
        ...


# -- optional capabilities of a sink (the runner asks `isinstance`, never probes names) ----------


@runtime_checkable
class StartsEpochs(Protocol):
    """Told at the epoch boundary, before the epoch's tasks, which key-group ranges the epoch
    cuts its output into (a Kafka sink opens the parts' producers meanwhile)."""

    def start_epoch(
        self, namespace: str, branch: str, epoch: int, ranges: list[tuple[int, int]]
    ) -> None: ...


@runtime_checkable
class Closes(Protocol):
    """Releases what it holds when the job stops (a Kafka sink aborts open transactions and
    closes its producers)."""

    def close(self) -> None: ...


def output_of(
    repo: Repository, namespace: str, manifest: Any, snapshot_id: str, pending: Mapping[str, Any],
    crash: tuple[str, int] | None = None,
) -> EpochOutput:  # fmt: skip
    """The output a manifest's pending record names (a restart finishing the second phase)."""
    parts = tuple(OutputPart.from_json(p) for p in pending["parts"])
    key = tuple(str(k) for k in manifest.extra.get("key", ()))
    return EpochOutput(repo, namespace, manifest.branch, int(pending["epoch"]), key, parts,
                       snapshot_id, crash)  # fmt: skip


__all__ = [
    "SINKS",
    "Closes",
    "EpochOutput",
    "Held",
    "OutputPart",
    "Sink",
    "StartsEpochs",
    "output_of",
]
