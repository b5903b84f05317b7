"""Sinks that follow the branch: the second phase of the epoch commit for destinations that
read each epoch's output back from the store, catch up in order, and go back on rollback.

A *chain sink* (the Delta Lake and PostgreSQL destinations) stages nothing outside the store:
an epoch's output is already in the snapshot store, unseen by the destination's readers, once
the epoch's tasks wrote it; ``prepare`` only records where the epoch goes. After the snapshot's
compare-and-swap, `SinkFollower.follow` brings every chain sink to the branch head, one epoch
at a time in epoch order, each write carrying the destination's own idempotence mark (Delta's
application transaction, a PostgreSQL high-water mark in the rows' transaction). So:

- a sink whose destination is down does not stop the job: the failure is logged, the job goes
  on committing snapshots, and the next attempt (every epoch, and while the job idles) writes
  every epoch it lacks, in order; its lag (epochs, and seconds since the oldest epoch it lacks
  was committed) goes into each epoch's stats (``sink_lag_epochs``, ``sink_lag_s``);
- a restart, at any parallelism, finds what the destination holds (`ChainSink.held`) and
  writes what is missing: an epoch is never shown twice nor skipped;
- after a rollback the destination holds epochs that are no longer on the branch's
  first-parent chain: the follower finds the newest epoch where the destination and the chain
  agree (the snapshot that wrote it) and rewinds the destination to it (`ChainSink.rewind`),
  then writes the chain's epochs after it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from runners.engine.output import EPOCH
from runners.engine.sinks import EpochOutput, Held, OutputPart
from snapshots_store import Manifest, Repository

log = logging.getLogger(__name__)

#: the stats key of the sinks' lag in epochs (the largest; ``<key>.<sink name>``: each one's)
LAG_KEY = "sink_lag_epochs"
#: seconds between attempts to reach a destination that failed (the job goes on meanwhile)
RETRY_S = 2.0


class SinkRefused(ValueError):
    """The destination refuses the sink's writes for good (another branch writes the table,
    a schema the table does not take): the message names the sink and the field. Other
    errors (the destination unreachable, a read-only path) leave the sink behind."""


@runtime_checkable
class ChainSink(Protocol):
    """A destination that holds the output of a branch's first-parent chain, epoch by epoch."""

    name: str

    def held(self, writer: str) -> Held | None:
        """The newest epoch `writer` (a branch identity) wrote into the destination."""
        ...

    def snapshot_of(self, writer: str, epoch: int) -> str | None:
        """The snapshot whose epoch `epoch` the destination holds (None: not held)."""
        ...

    def write(self, writer: str, output: EpochOutput) -> None:
        """Show one epoch's output, idempotently (nothing when the destination holds it)."""
        ...

    def rewind(
        self, writer: str, epoch: int, snapshot_id: str | None, replay: Sequence[EpochOutput]
    ) -> None:
        """Drop the epochs after `epoch` (`replay`: the chain's epochs up to it, for a
        destination that keeps only the latest row per key)."""
        ...


def writer_id(namespace: str, branch: str, sink: str) -> str:
    """The branch identity a destination records (Delta's txn app id): never shared by a
    fork, whose branch has another name."""
    return f"epochal/{namespace}/{branch}/{sink}"


@dataclass(frozen=True)
class ChainEpoch:
    """The snapshot of the first-parent chain that produced an epoch's output."""

    epoch: int
    snapshot_id: str
    manifest: Manifest

    def held(self) -> Held:
        return Held(self.epoch, self.snapshot_id)


def chain_epochs(repo: Repository, head_id: str, *, stop_below: int = 0) -> list[ChainEpoch]:
    """The epochs of the first-parent chain from `head_id`, oldest first, each with the
    *oldest* snapshot carrying its number (rollback, fork, rescale commits share their
    parent's epoch and add no output); epochs below `stop_below` are not read."""
    found: dict[int, ChainEpoch] = {}
    for sid, manifest in repo.log(head_id, first_parent=True):
        if manifest.epoch < stop_below:
            break
        if manifest.epoch > 0:
            found[manifest.epoch] = ChainEpoch(manifest.epoch, sid, manifest)
    return [found[e] for e in sorted(found)]


def epoch_output(
    repo: Repository, namespace: str, entry: ChainEpoch, crash: tuple[str, int] | None = None
) -> EpochOutput:
    """The output `entry`'s snapshot committed, as one part covering every key group."""
    m = entry.manifest
    part = OutputPart(0, max(m.max_parallelism - 1, 0), tuple(m.outputs))
    key = tuple(str(k) for k in m.extra.get("key", ()))
    return EpochOutput(
        repo, namespace, m.branch, entry.epoch, key, (part,), entry.snapshot_id, crash
    )


@dataclass
class _State:
    held: Held | None = None
    behind_since: str | None = None  # created_at of the oldest epoch the sink lacks
    lag_epochs: int = 0
    failed_at: float = 0.0
    error: str = ""
    known: bool = False


class SinkFollower:
    """Brings every chain sink of a runner to its branch head (see the module docstring)."""

    def __init__(
        self,
        repo: Repository,
        namespace: str,
        branch: str,
        sinks: Sequence[ChainSink],
        crash: tuple[str, int] | None = None,
    ) -> None:
        self.repo = repo
        self.namespace = namespace
        self.branch = branch
        self.sinks = list(sinks)
        self.crash = crash
        self.states = {s.name: _State() for s in self.sinks}
        self._thread: threading.Thread | None = None
        self._refused: SinkRefused | None = None

    def writer(self, sink: ChainSink) -> str:
        return writer_id(self.namespace, self.branch, sink.name)

    # -- lag -------------------------------------------------------------------------------

    def behind(self) -> bool:
        """Whether a sink lacks epochs of the branch (not counting writes in flight)."""
        if self._thread is not None and self._thread.is_alive():
            return False
        return any(s.lag_epochs > 0 or not s.known for s in self.states.values())

    def lag_stats(self, now: datetime | None = None) -> dict[str, float]:
        """The largest lag over the sinks, as the next epoch's stats record it: epochs of the
        branch the destination lacks, and seconds since the oldest of them was committed;
        and each sink's epochs (``sink_lag_epochs.<name>``: the lineage view tells from them
        which sink holds which epoch, docs/sinks.md)."""
        if not self.sinks:
            return {}
        now = now or datetime.now(UTC)
        epochs = max(s.lag_epochs for s in self.states.values())
        seconds = 0.0
        for state in self.states.values():
            if state.lag_epochs and state.behind_since:
                since = datetime.fromisoformat(state.behind_since.replace("Z", "+00:00"))
                seconds = max(seconds, (now - since).total_seconds())
        each = {f"{LAG_KEY}.{name}": state.lag_epochs for name, state in self.states.items()}
        return {LAG_KEY: epochs, "sink_lag_s": round(seconds, 3), **each}

    # -- following -------------------------------------------------------------------------

    def follow_soon(self, head_id: str | None) -> None:
        """`follow(head_id)` in a thread of its own, so the destinations' writes overlap the
        next epoch's tasks; `settle` waits for it (the runner settles when those tasks end,
        so a destination is never more than the epoch in flight behind a healthy run)."""
        self.settle()
        if not self.sinks or head_id is None:
            return

        def run() -> None:
            try:
                self.follow(head_id)
            except SinkRefused as exc:
                self._refused = exc

        self._thread = threading.Thread(target=run, name="epochal-sink-follower", daemon=True)
        self._thread.start()

    def settle(self) -> None:
        """Wait for the writes `follow_soon` started; raise a destination's refusal."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._refused is not None:
            refused, self._refused = self._refused, None
            raise refused

    def follow(self, head_id: str | None, *, force: bool = False) -> None:
        """Bring every sink to `head_id` (the branch head); never raises for a destination
        that fails: it stays behind, retried after RETRY_S (or now, with `force`)."""
        if threading.current_thread() is not self._thread:
            self.settle()
        if head_id is None:
            return
        for sink in self.sinks:
            state = self.states[sink.name]
            if not force and state.error and time.monotonic() - state.failed_at < RETRY_S:
                self._note_behind(state, head_id)
                continue
            try:
                self._follow(sink, head_id, state)
                state.error = ""
            except SinkRefused:  # a configuration the destination refuses: say so, stop
                raise
            except Exception as exc:  # the destination is down or refuses: stay behind
                state.error = str(exc)
                state.failed_at = time.monotonic()
                log.warning("sink %s is behind the branch head %s: %s", sink.name, head_id, exc)
                self._note_behind(state, head_id)

    def _note_behind(self, state: _State, head_id: str) -> None:
        """The lag of a sink that could not write: the chain's epochs after the last one it
        was known to hold (all of them when it was never reached)."""
        held = 0 if state.held is None else state.held.epoch
        missing = [
            c for c in chain_epochs(self.repo, head_id, stop_below=held + 1) if c.epoch > held
        ]
        state.lag_epochs = len(missing)
        state.behind_since = missing[0].manifest.created_at if missing else None

    def _follow(self, sink: ChainSink, head_id: str, state: _State) -> None:
        writer = self.writer(sink)
        held = sink.held(writer)
        stop_below = 0 if held is None else held.epoch
        chain = chain_epochs(self.repo, head_id, stop_below=stop_below)
        by_epoch = {c.epoch: c for c in chain}
        head_epoch = chain[-1].epoch if chain else 0
        on_chain = by_epoch.get(held.epoch) if held is not None else None
        if held is not None and on_chain is not None and on_chain.snapshot_id == held.snapshot_id:
            start = held.epoch
        elif held is None:
            start = 0
        else:  # the destination holds epochs off the chain (a rollback): go back
            chain = chain_epochs(self.repo, head_id)
            by_epoch = {c.epoch: c for c in chain}
            start = 0
            for e in range(min(held.epoch, head_epoch), 0, -1):
                if sink.snapshot_of(writer, e) == by_epoch[e].snapshot_id:
                    start = e
                    break
            replay = [epoch_output(self.repo, self.namespace, c) for c in chain if c.epoch <= start]
            log.info("sink %s: rewinding from epoch %d to %d", sink.name, held.epoch, start)
            sink.rewind(writer, start, by_epoch[start].snapshot_id if start else None, replay)
        missing = [c for c in chain if c.epoch > start]
        state.known = True
        state.held = by_epoch[start].held() if start else None
        state.lag_epochs = len(missing)
        state.behind_since = missing[0].manifest.created_at if missing else None
        for index, entry in enumerate(missing):
            sink.write(writer, epoch_output(self.repo, self.namespace, entry, self.crash))
            state.held = Held(entry.epoch, entry.snapshot_id)
            state.lag_epochs -= 1
            later = missing[index + 1 : index + 2]
            state.behind_since = later[0].manifest.created_at if later else None


class ChainSinkBase:
    """The Sink protocol (sinks.py) on top of a chain sink: ``prepare`` records where the
    epoch goes (nothing leaves the store before the CAS); ``commit`` writes the epoch unless
    the destination holds it; ``committed`` is what the destination holds."""

    name: str

    def destination(self) -> str:  # pragma: no cover - each destination names itself
        raise NotImplementedError

    def prepare(self, output: EpochOutput) -> dict[str, Any]:
        return {
            "destination": self.destination(),
            "writer": writer_id(output.namespace, output.branch, self.name),
        }

    def commit(self, output: EpochOutput, pending: Mapping[str, Any]) -> None:
        writer = str(pending["writer"])
        held = self.held(writer)  # type: ignore[attr-defined]
        if held is not None and held.epoch >= output.epoch:
            return
        self.write(writer, output)  # type: ignore[attr-defined]

    def committed(self, pending: Mapping[str, Any]) -> Held | None:
        return self.held(str(pending["writer"]))  # type: ignore[attr-defined, no-any-return]


def epoch_table(output: EpochOutput) -> pa.Table:
    """One epoch's output rows (every part) with an ``_epoch`` column; no rows: a table of
    the ``_epoch`` column only."""
    tables = [t for part in output.parts for t in output.tables(part)]
    if not tables:
        return pa.table({EPOCH: pa.array([], pa.int64())})
    table = pa.concat_tables(tables, promote_options="permissive")
    return table.append_column(EPOCH, pa.array([output.epoch] * table.num_rows, pa.int64()))


__all__ = [
    "ChainEpoch",
    "ChainSink",
    "ChainSinkBase",
    "SinkFollower",
    "SinkRefused",
    "chain_epochs",
    "epoch_output",
    "epoch_table",
    "writer_id",
]
