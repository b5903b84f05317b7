"""Two-phase sinks on the catch-up driver: Iceberg, Redis Streams and RabbitMQ Streams follow
the branch like the chain sinks (sink_catchup.py), so a destination that is down costs lag,
not the job.

These sinks stage an epoch in ``prepare`` (Iceberg's data files, the logs' encoded rows and
generation) and make it visible in ``commit``. What they stage in memory is only a cache: the
pending record kept in the snapshot's manifest (``extra.sinks.<sink>``) and the epoch's output
in the store are enough to commit any epoch again (`Rederives`), which is what a restart
already did for the branch head. `StagedChainSink` turns such a sink into a `ChainSink`:

- ``write`` commits one epoch from the pending record of the snapshot that committed it (an
  epoch committed by a run that did not name the sink has none: nothing to write);
- ``held`` asks the destination (``committed``) with the newest pending record of the branch,
  and again with the pending record of the epoch the destination names, so that a log that
  holds a prefix of an epoch counts the epoch before it; a snapshot the destination does not
  record (a RabbitMQ stream's partial epoch) is read from that snapshot's first-parent chain.
  While the process writes in order, it remembers what it wrote and asks nothing;
- ``snapshot_of`` is read from the store: the destination holds the epochs of its newest
  epoch's first-parent chain (every epoch is committed in order along it);
- ``rewind`` is the sink's ``rollback_to`` (Iceberg removes the later epochs' files); a log
  cannot unpublish, so it keeps the abandoned epochs' records and the branch's next epochs
  follow them under a new generation (the rollback was confirmed by the operator).

A ``ValueError`` of the sink (a table or stream another branch writes, a schema the table
refuses, a stream that does not exist) is a refusal for good (`SinkRefused`); any other error
leaves the sink behind, retried by the follower.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from runners.engine.sink_catchup import ChainSink, SinkRefused, chain_epochs
from runners.engine.sinks import SINKS, EpochOutput, Held, output_of
from snapshots_store import Manifest, Repository

log = logging.getLogger(__name__)


@runtime_checkable
class Rederives(Protocol):
    """A two-phase sink whose second phase of any epoch can be derived again from the
    snapshot that committed it (its pending record and the epoch's output in the store)."""

    name: str

    def commit(self, output: EpochOutput, pending: Mapping[str, Any]) -> None: ...

    def committed(self, pending: Mapping[str, Any]) -> Held | None: ...

    def rollback_to(self, epoch: int, *, namespace: str, branch: str) -> None: ...

    def forget_staged(self) -> None:
        """Drop what ``prepare`` keeps in memory (the epochs are committed later, from the
        store): a destination down for long does not hold the job's memory."""
        ...


class StagedChainSink:
    """A `Rederives` sink as a `ChainSink` of one branch (see the module docstring)."""

    def __init__(self, sink: Rederives, repo: Repository, namespace: str, branch: str) -> None:
        self.sink = sink
        self.name = sink.name
        self.repo = repo
        self.namespace = namespace
        self.branch = branch
        self._known: Held | None = None  # what this process wrote last, in order
        self._chains: dict[str, dict[int, str]] = {}  # snapshot -> its chain's epoch snapshots

    def __repr__(self) -> str:
        return f"StagedChainSink({self.sink!r})"

    # -- the store's side ------------------------------------------------------------------

    def _entry(self, snapshot_id: str) -> tuple[Manifest, dict[str, Any]] | None:
        """The manifest of `snapshot_id` and its pending record of this sink (None: the run
        that committed it did not name the sink)."""
        manifest = self.repo.read_manifest(snapshot_id)
        entry = (manifest.extra.get(SINKS) or {}).get(self.name)
        return (manifest, entry) if isinstance(entry, dict) else None

    def _newest_entry(self) -> tuple[str, dict[str, Any]] | None:
        """The newest snapshot of the branch's first-parent chain with a pending record."""
        head = self.repo.read_ref(f"heads/{self.branch}")
        if head is None:
            return None
        for sid, manifest in self.repo.log(head.target, first_parent=True):
            entry = (manifest.extra.get(SINKS) or {}).get(self.name)
            if isinstance(entry, dict):
                return sid, entry
        return None

    def _chain_of(self, snapshot_id: str) -> dict[int, str]:
        """Epoch -> the snapshot that committed it, on `snapshot_id`'s first-parent chain."""
        if snapshot_id not in self._chains:
            epochs = chain_epochs(self.repo, snapshot_id)
            self._chains[snapshot_id] = {c.epoch: c.snapshot_id for c in epochs}
        return self._chains[snapshot_id]

    # -- the chain sink --------------------------------------------------------------------

    def held(self, writer: str) -> Held | None:
        if self._known is not None:
            return self._known
        newest = self._newest_entry()
        if newest is None:
            return None  # the branch never staged an epoch for the sink
        base, entry = newest
        held = self._ask(entry)
        if held is not None and held.snapshot_id and held.epoch != int(entry["epoch"]):
            named = self._readable_entry(held.snapshot_id)
            if named is not None:  # judge the epoch the destination names by its own record
                base, entry = held.snapshot_id, named
                held = self._ask(entry)
        if held is not None and not held.snapshot_id:  # a prefix of `base`'s epoch: before it
            snapshot = self._chain_of(base).get(held.epoch)
            held = None if snapshot is None else Held(held.epoch, snapshot)
        self._known = held
        return held

    def _readable_entry(self, snapshot_id: str) -> dict[str, Any] | None:
        try:
            found = self._entry(snapshot_id)
        except Exception:  # a snapshot the store no longer has: the destination's word
            return None
        return None if found is None else found[1]

    def _ask(self, entry: Mapping[str, Any]) -> Held | None:
        try:
            return self.sink.committed(entry["staged"])
        except ValueError as exc:
            raise SinkRefused(str(exc)) from exc

    def snapshot_of(self, writer: str, epoch: int) -> str | None:
        held = self.held(writer)
        if held is None or not held.snapshot_id or epoch > held.epoch:
            return None
        try:
            return self._chain_of(held.snapshot_id).get(epoch)
        except Exception:  # the destination's newest snapshot is gone from the store
            return None

    def write(self, writer: str, output: EpochOutput) -> None:
        assert output.snapshot_id is not None
        found = self._entry(output.snapshot_id)
        if found is not None:
            manifest, entry = found
            staged = output_of(
                self.repo, self.namespace, manifest, output.snapshot_id, entry, output.crash
            )
            try:
                self.sink.commit(staged, entry["staged"])
            except ValueError as exc:
                raise SinkRefused(str(exc)) from exc
            except Exception:
                self._known = None  # ask the destination again when it is back
                self.sink.forget_staged()
                raise
        self._known = Held(output.epoch, output.snapshot_id)

    def rewind(
        self, writer: str, epoch: int, snapshot_id: str | None, replay: Sequence[EpochOutput]
    ) -> None:
        from runners.engine.destinations.log_records import CannotUnpublishError

        self._known = None
        try:
            self.sink.rollback_to(epoch, namespace=self.namespace, branch=self.branch)
        except CannotUnpublishError:
            log.info(
                "sink %s keeps the records of the epochs after %d (a log cannot unpublish); "
                "the branch's next epochs follow them",
                self.name, epoch,
            )  # fmt: skip
        except ValueError as exc:
            raise SinkRefused(str(exc)) from exc


def followed_sinks(
    sinks: Sequence[Any], repo: Repository, namespace: str, branch: str
) -> tuple[list[ChainSink], list[Any]]:
    """(the sinks the catch-up driver follows: chain sinks, and the `Rederives` two-phase
    sinks wrapped as chain sinks; the others, whose commit stops the job when it fails:
    Kafka's, whose staged epoch is open broker transactions)."""
    followed: list[ChainSink] = []
    others: list[Any] = []
    for sink in sinks:
        if isinstance(sink, ChainSink):
            followed.append(sink)
        elif isinstance(sink, Rederives):
            followed.append(StagedChainSink(sink, repo, namespace, branch))
        else:
            others.append(sink)
    return followed, others


__all__ = ["Rederives", "StagedChainSink", "followed_sinks"]
