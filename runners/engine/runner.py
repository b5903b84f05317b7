"""The epoch loop on the driver: plan offsets, run one Spark job per epoch, commit by CAS.

Commit protocol (docs/engine.md): read the control document; plan ``[parent offsets, end)``;
map tasks route records to key groups and partially aggregate; p reduce tasks (one per
key-group range) merge with the parent's state, write chunks and outputs; the driver writes
the manifest and compare-and-swaps the branch ref — the only commit point.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from runners import config
from runners.engine import eventtime, exchange
from runners.engine import routing as routes
from runners.engine.crash import crash_spec, maybe_crash
from runners.engine.exchange import MapShare
from runners.engine.executors import ExecutorPool
from runners.engine.hotswap import HOLD as SWAP_HOLD
from runners.engine.hotswap import SWAP, SwapGate, partner_reader, swap_gate
from runners.engine.job import Job
from runners.engine.keygroups import (
    DEFAULT_MAX_PARALLELISM,
    check_parallelism,
    key_group_range,
    key_group_ranges,
)
from runners.engine.sink_catchup import SinkFollower
from runners.engine.sinks import SINKS, EpochOutput, OutputPart, StartsEpochs, output_of
from runners.engine.sources import (
    AdvancesOffsets,
    PreparesEpochs,
    RecordsLineage,
    ReportsBacklog,
    ReportsBacklogRecords,
    Source,
    Split,
    end_offsets,
)
from runners.engine.staged_catchup import followed_sinks
from runners.engine.tasks import (
    ReduceResult,
    TaskPlan,
    map_split,
    reduce_partition,
    restore_partition,
    restore_tasks,
    scan_partition,
    split_partition,
)
from runners.launcher import stop_requested
from snapshots_store import Manifest, PrefixedBackend, RefConflictError, Repository

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

Notify = Callable[["EpochResult"], None] | str | None


class EngineError(RuntimeError):
    """The engine cannot go on (branch moved underneath it, M mismatch, …)."""


@dataclass(frozen=True)
class EpochResult:
    """What one committed epoch did."""

    snapshot_id: str
    epoch: int
    records_in: int
    output_rows: int
    dead_letters: int
    duration_s: float
    commit_ms: float
    bytes_written: int
    changed_state_bytes: int
    parallelism: int


@dataclass(frozen=True)
class Opening:
    """What the gate stage lets through: the control document and the branch head the epoch
    builds on, at parallelism p of max parallelism m."""

    control: dict[str, Any]
    #: the branch head the commit's CAS expects (None: a new branch)
    expected: str | None
    #: the parent snapshot (the head, or the runner's base on a new branch)
    parent_id: str | None
    parent: Manifest | None
    max_parallelism: int
    parallelism: int
    #: the parent's offsets of the job's source (partition -> offset)
    committed: dict[str, int]
    swap: SwapGate

    @property
    def last_epoch(self) -> int:
        return 0 if self.parent is None else self.parent.epoch


@dataclass(frozen=True)
class PlannedEpoch:
    """The plan stage's result: the epoch's tasks, splits and routing."""

    opening: Opening
    tasks: TaskPlan
    splits: list[Split]
    route: str
    pieces: list[routes.Piece]
    #: the executors resized for p (None: no executor pool, e.g. local[n])
    executors: dict[str, Any] | None
    #: when the epoch began (time.perf_counter)
    started: float


@dataclass(frozen=True)
class ExecutedEpoch:
    """The execute stage's result: each task's report (in task order)."""

    results: list[ReduceResult]
    #: the restore stage's stats ``restore_*`` (None: no restore ran)
    restore: dict[str, int | float] | None
    tasks_wall_s: float


@dataclass(frozen=True)
class StagedEpoch:
    """The manifest stage's result: the written, not yet committed, manifest."""

    planned: PlannedEpoch
    manifest: Manifest
    #: the epoch's output as the sinks prepared it (None: the job has no sinks)
    sink_output: EpochOutput | None
    #: each sink's pending record (``extra.sinks``)
    pending: dict[str, Any]
    #: when the manifest stage began writing (commit_ms counts from here)
    commit_started: float


def _store_location(repo: Repository) -> tuple[str, str]:
    backend = repo.backend
    if not isinstance(backend, PrefixedBackend):
        raise EngineError("the engine needs a Repository opened with Repository.open(url, ns)")
    return backend.inner.url, backend.prefix.rstrip("/")


class EpochRunner:
    """Runs a job's epochs on one branch, each committed as a snapshot."""

    def __init__(
        self,
        spark: SparkSession,
        job: Job,
        *,
        repo: Repository,
        branch: str = "main",
        parallelism: int = 2,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
        base: str | None = None,
        notify: Notify = None,
        poll_interval_s: float = 0.5,
        compaction_ratio: float = 1.0,
        routing: str = "auto",
        scan_max_parallelism: int = 2,
        run_id: str | None = None,
    ) -> None:
        check_parallelism(parallelism, max_parallelism)
        self.spark = spark
        self.job = job
        self.repo = repo
        self.branch = branch
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.base = None if base is None else repo.resolve(base)
        self.notify = notify
        self.poll_interval_s = poll_interval_s
        self.compaction_ratio = compaction_ratio
        routes.choose(routing, 1, 1, scan_max_parallelism)  # a bad name fails here, not mid-run
        self.routing = routing
        self.scan_max_parallelism = scan_max_parallelism
        #: where the split routing's map tasks leave their rows (None: Spark's shuffle)
        self.exchange_root = exchange.exchange_root(spark.sparkContext.master)
        self.store_url, self.namespace = _store_location(repo)
        self.crash = crash_spec()
        self.stopped_reason: str | None = None
        #: the run id a stop request in the control document must name (default
        #: $EPOCHAL_RUN_ID; None: stop requests are ignored)
        self.run_id = run_id if run_id is not None else config.current().run_id
        #: set by `interrupt` (a signal handler or another thread): no further epoch commits
        self.interrupted: str | None = None
        self._wake = threading.Event()
        self._in_tasks = False
        #: on a Kubernetes master: executors follow the parallelism (executors.py)
        self.executors = ExecutorPool(spark.sparkContext)
        #: the parallelism this runner last restored state for (None: not yet)
        self._restored_at: int | None = None
        #: whether the head's pending sink commits (a crashed run's) were finished
        self._sinks_finished = not job.sinks
        #: the sinks that follow the branch head and catch up in order (sink_catchup.py;
        #: Iceberg and the log sinks through staged_catchup.py); the others (Kafka's) commit
        #: after the CAS and stop the job when they cannot
        chain, self._two_phase_sinks = followed_sinks(job.sinks, repo, self.namespace, branch)
        self.follower = SinkFollower(repo, self.namespace, branch, chain, self.crash)

    # -- one epoch, in five stages: gate -> plan -> execute -> manifest -> commit ---------------
    #
    # Each stage is a method taking the previous stage's result; gate, plan and execute return
    # None (with `stopped_reason` set) when the epoch does not go on. docs/engine.md names the
    # hook points: the sinks' second phase (`_prepare_sinks` in the manifest stage before the
    # CAS, `_commit_sinks` in the commit stage after it) and event time (`_epoch_clock` in
    # the plan stage reads what the parent recorded; the manifest stage records what the next
    # epoch reads).

    def run_epoch(self) -> EpochResult | None:
        """Process and commit the next epoch; None when there is no new data, or when the
        control document pauses or stops the job (see `stopped_reason`)."""
        started = time.perf_counter()
        opening = self.gate()
        if opening is None:
            return None
        planned = self.plan(opening, started)
        if planned is None:
            return None
        executed = self.execute(planned)
        if executed is None:
            return None
        return self.commit(self.manifest(planned, executed))

    def gate(self) -> Opening | None:
        """Stage 1: may an epoch run? Reads the control document and the branch head; None
        (with `stopped_reason`) when interrupted, stopped, paused or held by a hot-swap.
        Before the runner's first epoch it finishes the head's pending sink commits."""
        if self.interrupted is not None:
            self.stopped_reason = self.interrupted
            return None
        control, _ = self.repo.read_control(self.branch)
        if self.run_id is not None and stop_requested(control, self.run_id):
            self.stopped_reason = "stop requested"
            return None
        expected, parent_id, parent = self._parent()
        if not self._sinks_finished:
            self._finish_sinks(expected, parent)
        elif self.follower.behind():  # a destination that was down: catch up, in order
            self.follower.follow(expected)
        last_epoch = 0 if parent is None else parent.epoch
        stop_after = control.get("stop_after_epoch")
        if isinstance(stop_after, int) and last_epoch >= stop_after:
            self.stopped_reason = f"stop_after_epoch {stop_after}"
            return None
        if control.get("paused"):
            self.stopped_reason = "paused"
            return None
        m = self.max_parallelism if parent is None else parent.max_parallelism
        if parent is not None and m != self.max_parallelism:
            log.info("lineage max parallelism is %d (runner asked %d)", m, self.max_parallelism)
        p = check_parallelism(int(control.get("parallelism", self.parallelism)), m)
        gate = swap_gate(control, last_epoch + 1, partner_reader(control))
        if gate.hold is not None:  # a hot-swap holds this job before the epoch (hotswap.py)
            self.stopped_reason = gate.hold
            return None
        committed = {} if parent is None else dict(parent.offsets.get(self.job.source.name, {}))
        return Opening(control, expected, parent_id, parent, m, p, committed, gate)

    def _parent(self) -> tuple[str | None, str | None, Manifest | None]:
        """(expected head, parent snapshot id, parent manifest)."""
        head = self.repo.read_ref(f"heads/{self.branch}")
        expected = None if head is None else head.target
        parent_id = expected if expected is not None else self.base
        parent = None if parent_id is None else self.repo.read_manifest(parent_id)
        return expected, parent_id, parent

    def plan(self, opening: Opening, started: float | None = None) -> PlannedEpoch | None:
        """Stage 2: the epoch's splits, tasks and routing; None (with `stopped_reason`) when
        the source has no new data. At the boundary, before any task: executors for p and the
        sinks' `start_epoch`. `started` is when the epoch began (default: now)."""
        started = time.perf_counter() if started is None else started
        source = self.job.source
        epoch = opening.last_epoch + 1
        if isinstance(source, PreparesEpochs):
            source.prepare_epoch(opening.control, epoch)
        splits = source.plan(opening.committed)
        p, m, parent = opening.parallelism, opening.max_parallelism, opening.parent
        timing = eventtime.plan_epoch(self.job, parent)  # the watermark the parent recorded
        if not splits and not timing.due:  # (windows due without input: a no-data epoch)
            self.stopped_reason = "no new data"
            return None
        executors = self.executors.resize(p)  # none on local[n]
        ranges = [(r.start, r.end) for r in key_group_ranges(p, m)]
        for sink in self.job.sinks:  # e.g. open Kafka producers while the tasks run
            if isinstance(sink, StartsEpochs):
                sink.start_epoch(self.namespace, self.branch, epoch, ranges)
        tasks = TaskPlan(
            job=self.job,
            store_url=self.store_url,
            namespace=self.namespace,
            branch=self.branch,
            epoch=epoch,
            parallelism=p,
            max_parallelism=m,
            key_groups={}
            if parent is None
            else {kg: tuple(chain) for kg, chain in parent.key_groups.items()},
            processing_time_ms=self._epoch_clock(parent, epoch),
            crash=self.crash,
            driver_pid=os.getpid(),
            compaction_ratio=self.compaction_ratio,
            event_time=timing,
        )
        route, pieces = self._route(tasks, splits) if splits else ("scan", [])
        return PlannedEpoch(opening, tasks, splits, route, pieces, executors, started)

    def _epoch_clock(self, parent: Manifest | None, epoch: int) -> int:
        """The epoch's processing time (ms): logical, or the driver's clock never running
        backwards from the parent's. Hook point: event time's watermark is read here from the
        parent's manifest (recorded by the manifest stage of the epoch before)."""
        if self.job.time_mode == "logical":
            return epoch * self.job.logical_epoch_ms
        return max(int(time.time() * 1000), 0 if parent is None else parent.processing_time_ms)

    def execute(self, planned: PlannedEpoch) -> ExecutedEpoch | None:
        """Stage 3: the Spark job(s): a restore stage when the runner has not loaded the state
        at this parallelism yet, then the epoch's tasks (chunks and outputs written, nothing
        committed). None (with `stopped_reason`) when interrupted: the epoch is abandoned."""
        plan = planned.tasks
        p = plan.parallelism
        restore: dict[str, int | float] | None = None
        results: list[ReduceResult] = []
        tasks_started = time.perf_counter()
        try:
            self._in_tasks = True
            if self.interrupted is None and plan.key_groups and self._restored_at != p:
                restore = self._restore(plan)
                self._restored_at = p
                tasks_started = time.perf_counter()
            if self.interrupted is None:
                results = self._run_tasks(plan, planned.splits, planned.route, planned.pieces)
        except Exception:
            if self.interrupted is None:
                raise
            log.info("epoch %d: Spark job ended after %s", plan.epoch, self.interrupted,
                     exc_info=True)  # fmt: skip
        finally:
            self._in_tasks = False
        tasks_wall_s = time.perf_counter() - tasks_started
        if self.interrupted is not None:
            # Never start a commit after an interrupt: the epoch is abandoned, its objects
            # (if any were written) stay unreferenced, and a restart replans it.
            self.stopped_reason = (
                f"{self.interrupted}: epoch {plan.epoch} abandoned before its commit"
            )
            return None
        self.follower.settle()  # the previous epoch's sink writes overlapped these tasks
        maybe_crash(self.crash, "after_chunks", plan.epoch)
        maybe_crash(self.crash, "after_outputs", plan.epoch)
        ordered = sorted(results, key=lambda r: r.task)
        return ExecutedEpoch(ordered, restore, tasks_wall_s)

    def manifest(self, planned: PlannedEpoch, executed: ExecutedEpoch) -> StagedEpoch:
        """Stage 4: the sinks prepare (first half of their second phase, before the CAS), then
        the epoch's manifest is built and written (not yet committed)."""
        opening, plan, results = planned.opening, planned.tasks, executed.results
        parent, source = opening.parent, self.job.source
        key_groups = {} if parent is None else dict(parent.key_groups)
        outputs: list[str] = []
        for r in results:
            key_groups.update(r.key_groups)
            outputs.extend(r.outputs)
        if not opening.swap.emit:  # a hot-swap voids this job's output (state goes on)
            outputs = []
        sink_output, pending = self._prepare_sinks(plan, results, emit=opening.swap.emit)
        maybe_crash(self.crash, "after_prepare", plan.epoch)
        offsets = {} if parent is None else {s: dict(o) for s, o in parent.offsets.items()}
        offsets[source.name] = (
            source.end_offsets(opening.committed, planned.splits)
            if isinstance(source, AdvancesOffsets)
            else end_offsets(opening.committed, planned.splits)
        )
        stats = self._stats(planned, executed, offsets[source.name])
        watermark, late = eventtime.after_epoch(  # recorded here, applied by the next epoch
            self.job, parent, plan.event_time, (r.event_time for r in results),
            plan.processing_time_ms, plan.max_parallelism,
        )  # fmt: skip
        stats.update(late)
        commit_started = time.perf_counter()  # commit_ms: writing the manifest and the CAS
        stats["process_s"] = round(commit_started - planned.started, 6)
        manifest = Manifest(
            branch=self.branch,
            epoch=plan.epoch,
            parents=() if opening.parent_id is None else (opening.parent_id,),
            max_parallelism=plan.max_parallelism,
            parallelism=plan.parallelism,
            # an epoch that runs at another parallelism than its parent is a visible rescale
            kind="epoch" if parent is None or plan.parallelism == parent.parallelism else "rescale",
            operation_id=_new_operation(opening.control, parent),
            key_groups=key_groups,
            outputs=outputs,
            offsets=offsets,
            code_version=self.job.code_version,
            config_hash=self.job.config_hash,
            processing_time_ms=plan.processing_time_ms,
            stats=stats,
            extra={**self._extra(planned, executed, pending), **watermark},
        )
        self.repo.write_manifest(manifest)
        maybe_crash(self.crash, "after_manifest", plan.epoch)
        return StagedEpoch(planned, manifest, sink_output, pending, commit_started)

    def _stats(
        self, planned: PlannedEpoch, executed: ExecutedEpoch, offsets: dict[str, int]
    ) -> dict[str, int | float]:
        """The manifest's ``stats``: what the epoch's tasks did, summed (and the restore)."""
        results = executed.results
        stats: dict[str, int | float] = {
            "records_in": sum(r.records_in for r in results),
            "output_rows": sum(r.output_rows for r in results),
            "dead_letters": sum(r.dead_letters for r in results),
            "bytes_written": sum(r.bytes_written for r in results),
            "changed_state_bytes": sum(r.changed_state_bytes for r in results),
            "chunks_written": sum(r.chunks_written for r in results),
            "cache_hits": sum(r.cache_hits for r in results),
            "cache_misses": sum(r.cache_misses for r in results),
        }
        stats.update(
            splits=len(planned.splits),
            map_s=round(max(r.map_s for r in results), 6),
            reduce_s=round(max(r.reduce_s for r in results), 6),
            # busy time per task (the autoscaler's true processing rate: records / busy_s)
            busy_s=round(sum(r.busy_s for r in results), 6),
            busy_max_s=round(max(r.busy_s for r in results), 6),
            # the Spark job's wall time (tasks, scheduling, exchange); the rest of process_s
            # is the driver's own work before and after it
            tasks_wall_s=round(executed.tasks_wall_s, 6),
        )
        state_read = sum(r.state_read_bytes for r in results)
        if state_read:  # stored bytes the epoch's tasks read (not in the state cache)
            stats["state_read_bytes"] = state_read
        if executed.restore is not None:
            stats.update(executed.restore)
        stats.update(_backlog(self.job.source, offsets))
        stats.update(self.follower.lag_stats())
        return stats

    def _extra(
        self, planned: PlannedEpoch, executed: ExecutedEpoch, pending: dict[str, Any]
    ) -> dict[str, Any]:
        """The manifest's ``extra``: the job, the control applied, each task's figures, what
        the source read, the swap acknowledgement, the executors, the sinks' pending records."""
        opening, source = planned.opening, self.job.source
        swap = opening.swap.record
        return {
            "job": self.job.name,
            "key": list(self.job.key_columns),
            "routing": planned.route,
            "control": _applied(opening.control, opening.parallelism),
            # what each task did: Flink's per-subtask busy time and records, for the epoch
            # view (skew, a task busier than the others)
            "tasks": [
                {
                    "task": r.task,
                    "records_in": r.records_in,
                    "output_rows": r.output_rows,
                    "busy_s": round(r.busy_s, 6),
                    "bytes_written": r.bytes_written,
                    "key_groups_written": len(r.key_groups),
                }
                for r in executed.results
            ],
            **(
                {"inputs": {source.name: source.lineage(opening.committed, planned.splits)}}
                if isinstance(source, RecordsLineage)
                else {}
            ),
            **({} if swap is None else {SWAP: swap}),
            **({} if planned.executors is None else {"executors": planned.executors}),
            **({SINKS: pending} if pending else {}),
        }

    def commit(self, staged: StagedEpoch) -> EpochResult:
        """Stage 5: compare-and-swap the branch ref to the manifest (the only commit point),
        then the sinks commit (second half of their second phase) and the control plane is
        told."""
        planned, manifest = staged.planned, staged.manifest
        epoch, p, expected = manifest.epoch, manifest.parallelism, planned.opening.expected
        try:
            snapshot_id = self.repo.commit(
                manifest,
                self.branch,
                expected_head=expected,
                operation_id=manifest.operation_id,
                reason=f"epoch {epoch}"
                if manifest.kind == "epoch"
                else f"epoch {epoch}, rescaled to p={p}",
            )
        except RefConflictError as exc:
            raise EngineError(
                f"branch {self.branch!r} moved to {exc.actual} while epoch {epoch} ran "
                f"(expected {expected}); another writer or an operation owns it: restart the "
                "job from the new head"
            ) from None
        commit_ms = (time.perf_counter() - staged.commit_started) * 1000
        maybe_crash(self.crash, "after_cas", epoch)
        if staged.sink_output is not None:  # the second phase: the destinations show it
            self._commit_sinks(staged.sink_output.committing(snapshot_id), staged.pending)
        stats = manifest.stats
        result = EpochResult(
            snapshot_id=snapshot_id,
            epoch=epoch,
            records_in=int(stats["records_in"]),
            output_rows=int(stats["output_rows"]),
            dead_letters=int(stats["dead_letters"]),
            duration_s=time.perf_counter() - planned.started,
            commit_ms=commit_ms,
            bytes_written=int(stats["bytes_written"]),
            changed_state_bytes=int(stats["changed_state_bytes"]),
            parallelism=p,
        )
        self._notify(result)
        return result

    # -- sinks: the second phase of the epoch commit (sinks.py) ------------------------------

    def _prepare_sinks(
        self, plan: TaskPlan, results: list[ReduceResult], *, emit: bool
    ) -> tuple[EpochOutput | None, dict[str, Any]]:
        """Stage the epoch's output in every sink; (the output, pending records by sink)."""
        if not self.job.sinks:
            return None, {}
        parts = []
        for r in sorted(results, key=lambda r: r.task):
            rng = key_group_range(r.task, plan.parallelism, plan.max_parallelism)
            parts.append(OutputPart(rng.start, rng.end, tuple(r.outputs) if emit else ()))
        output = EpochOutput(self.repo, self.namespace, self.branch, plan.epoch,
                             self.job.key_columns, tuple(parts), crash=self.crash)  # fmt: skip
        pending = {}
        for sink in self.job.sinks:
            try:
                pending[sink.name] = output.pending(sink.prepare(output))
            except Exception as exc:
                raise EngineError(
                    f"sink {sink.name!r} could not prepare epoch {plan.epoch}: {exc}; nothing "
                    "was committed"
                ) from exc
        return output, pending

    def _commit_sinks(self, output: EpochOutput, pending: dict[str, Any]) -> None:
        self.follower.follow_soon(output.snapshot_id)  # overlaps the next epoch's tasks
        for sink in self._two_phase_sinks:
            try:
                sink.commit(output, pending[sink.name]["staged"])
            except Exception as exc:
                raise EngineError(
                    f"sink {sink.name!r} could not commit epoch {output.epoch} (snapshot "
                    f"{output.snapshot_id} is committed; restarting the job finishes the "
                    f"sink's commit): {exc}"
                ) from exc

    def _finish_sinks(self, head_id: str | None, head: Manifest | None) -> None:
        """Before the runner's first epoch: finish the second phase the branch head records
        for each sink, if the destination does not hold that snapshot's epoch yet (a run
        killed between the CAS and the sink's commit, or inside it)."""
        entries = {} if head is None or head_id is None else head.extra.get(SINKS) or {}
        self.follower.follow(head_id, force=True)
        for sink in self._two_phase_sinks:
            entry = entries.get(sink.name)
            if not isinstance(entry, dict):
                continue
            assert head is not None and head_id is not None
            try:
                held = sink.committed(entry["staged"])
                if held is None or held.snapshot_id != head_id:
                    log.info("sink %s: finishing epoch %d of %s", sink.name, head.epoch, head_id)
                    output = output_of(self.repo, self.namespace, head, head_id, entry, self.crash)
                    sink.commit(output, entry["staged"])
            except Exception as exc:
                raise EngineError(
                    f"sink {sink.name!r} could not finish epoch {head.epoch} of snapshot "
                    f"{head_id} (committed in the store, not yet in the destination): {exc}"
                ) from exc
        self._sinks_finished = True

    def _route(self, plan: TaskPlan, splits: list[Split]) -> tuple[str, list[routes.Piece]]:
        """The epoch's routing (routing.py) and, for the split routing, its read pieces."""
        p = plan.parallelism
        if self.routing in ("scan", "shuffle") or (self.routing == "auto" and p == 1):
            return routes.choose(self.routing, p, len(splits), self.scan_max_parallelism), []
        pieces = routes.pieces(self.job.source, splits, p)
        # without a file exchange the split routing pays Spark's shuffle: auto does not pick it
        usable = len(pieces) if self.exchange_root is not None else 1
        route = routes.choose(self.routing, p, usable, self.scan_max_parallelism)
        return route, pieces if route == "split" else []

    def _restore(self, plan: TaskPlan) -> dict[str, int | float]:
        """The restore stage before a runner's first epoch and after a parallelism change:
        its tasks load the key groups into the machine's state cache at once (long
        sequential reads of the packs), so the epoch's tasks start with their state. With
        an exchange directory (a local master, or a shared one) it runs one task per core,
        the tasks claiming batches of key groups as they go (`restore_partition` with
        claims); without, p tasks rounded up to a multiple of the cores, each a fixed
        slice. Returns the manifest stats ``restore_*``."""
        started = time.perf_counter()

        p = plan.parallelism
        sc = self.spark.sparkContext
        cores = max(1, sc.defaultParallelism)
        n = cores if self.exchange_root is not None else restore_tasks(p, cores)
        with contextlib.ExitStack() as stack:
            claims = (
                stack.enter_context(exchange.epoch_directory(self.exchange_root, plan.epoch))
                if self.exchange_root is not None
                else None
            )

            def restorer(index: int, _: Any) -> Any:
                return restore_partition(plan, index, n, claims)

            reports = sc.parallelize(range(n), n).mapPartitionsWithIndex(restorer).collect()
        read = [r for r in reports if r.stored_bytes]
        stats: dict[str, int | float] = {
            "restore_s": round(time.perf_counter() - started, 6),
            "restore_bytes": sum(r.stored_bytes for r in read),
            "restore_payload_bytes": sum(r.payload_bytes for r in read),
        }
        if read:  # from the first task's read to the last task's state in the cache
            span = max(r.ended for r in read) - min(r.started for r in read)
            stats["restore_span_s"] = round(span, 6)
        return stats

    def _run_tasks(
        self, plan: TaskPlan, splits: list[Split], route: str, pieces: list[routes.Piece]
    ) -> list[ReduceResult]:
        sc = self.spark.sparkContext
        p = plan.parallelism
        split = route == "split"

        def mapper(item: tuple[int, Split]) -> Any:
            return map_split(plan, item[0], item[1])

        def piece_mapper(piece: routes.Piece) -> Any:
            return map_split(
                plan,
                piece.split_index,
                piece.split,
                part=piece.part,
                first_row=piece.first_row,
                partial=False,
            )

        def reducer(index: int, shares: Any) -> Any:
            return reduce_partition(plan, index, shares, partial=not split)

        def by_task(task: int) -> int:
            return task

        results: list[ReduceResult]
        if route == "scan":

            def scanner(index: int, _: Any) -> Any:
                return scan_partition(plan, index, splits)

            results = sc.parallelize(range(p), p).mapPartitionsWithIndex(scanner).collect()
        elif split and self.exchange_root is not None:
            results = self._run_split(plan, pieces)
        else:
            if split:
                shares: Any = sc.parallelize(pieces, len(pieces)).flatMap(piece_mapper)
            else:
                shares = sc.parallelize(list(enumerate(splits)), len(splits)).flatMap(mapper)
            routed = shares.partitionBy(p, by_task)
            results = routed.mapPartitionsWithIndex(reducer).collect()
        if len(results) != p:
            raise EngineError(f"expected {p} reducer reports, got {len(results)}")
        return results

    def _run_split(self, plan: TaskPlan, pieces: list[routes.Piece]) -> list[ReduceResult]:
        """The split routing through exchange files, in one Spark job of p tasks
        (tasks.split_partition: each maps its pieces, collects the others', reduces)."""
        sc = self.spark.sparkContext
        p = plan.parallelism
        assert self.exchange_root is not None
        with exchange.epoch_directory(self.exchange_root, plan.epoch) as directory:

            def split_task(index: int, _: Any) -> Any:
                return split_partition(plan, index, pieces, directory)

            results: list[ReduceResult] = (
                sc.parallelize(range(p), p).mapPartitionsWithIndex(split_task).collect()
            )
        return results

    def _notify(self, result: EpochResult) -> None:
        """Best effort: tell the control plane in the background; never wait, never fail."""
        target = self.notify
        if target is None:
            maybe_crash(self.crash, "mid_notify", result.epoch)
            return
        payload = {"branch": self.branch, "job": self.job.name, **asdict(result)}

        def send() -> None:
            try:
                if callable(target):
                    target(result)
                else:
                    request = urllib.request.Request(
                        target,
                        data=json.dumps(payload).encode(),
                        headers={"Content-Type": "application/json"},
                        method="POST",
                    )
                    urllib.request.urlopen(request, timeout=2).close()
            except Exception:
                log.warning("notification for epoch %d failed", result.epoch, exc_info=True)

        threading.Thread(target=send, name="epochal-notify", daemon=True).start()
        maybe_crash(self.crash, "mid_notify", result.epoch)

    # -- stopping ----------------------------------------------------------------------------

    def interrupt(self, reason: str) -> None:
        """Stop at the next epoch boundary without committing anything more (safe to call from
        a signal handler or another thread).

        An epoch whose Spark job is running is abandoned: its jobs are cancelled and nothing
        is committed; an epoch already committing (manifest written, CAS under way) finishes,
        since the CAS is the only commit point. `run_epoch` then returns None with
        `stopped_reason` naming `reason`."""
        self.interrupted = reason
        self._wake.set()
        if self._in_tasks:
            threading.Thread(target=self._cancel_jobs, name="epochal-cancel", daemon=True).start()

    def _cancel_jobs(self) -> None:
        try:
            self.spark.sparkContext.cancelAllJobs()
        except Exception:  # the JVM may already be gone (the signal reached it too)
            log.debug("cancelling the epoch's Spark jobs failed", exc_info=True)

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; returns early (True) when interrupted."""
        return self._wake.wait(seconds) or self.interrupted is not None

    # -- the loop ----------------------------------------------------------------------------

    def run(
        self,
        max_epochs: int | None = None,
        *,
        follow: bool = False,
        on_event: Callable[[dict[str, Any]], None] | None = None,
    ) -> list[EpochResult]:
        """Run epochs until the source has no new data, the control document says stop, the
        runner is interrupted, or `max_epochs` epochs committed. A paused job waits (polling
        the control document); with `follow` a job without new data waits for it too,
        polling every `poll_interval_s`.

        `on_event` is told, as JSON-ready documents: ``{"event": "epoch_start", "n": k}``
        once before the k-th epoch of this run is attempted (not per poll), ``{"event":
        "committed", …EpochResult}`` after each commit and ``{"event": "stopped", "reason":
        …}`` when the loop ends (an exception ends it without)."""
        emit = on_event if on_event is not None else _ignore
        results: list[EpochResult] = []
        announced = 0
        while max_epochs is None or len(results) < max_epochs:
            if announced == len(results):
                announced += 1
                emit({"event": "epoch_start", "n": announced})
            result = self.run_epoch()
            if result is not None:
                results.append(result)
                emit({"event": "committed", **asdict(result)})
                continue
            if self.should_wait(follow=follow):
                self.wait(self.poll_interval_s)
                continue
            self.follower.settle()  # the last epoch's sink writes
            emit({"event": "stopped", "reason": self.stopped_reason or "stopped"})
            return results
        self.follower.settle()
        emit({"event": "stopped", "reason": f"max epochs {max_epochs}"})
        return results

    def should_wait(self, *, follow: bool) -> bool:
        """After `run_epoch` returned None: poll again (paused, or following a source that
        has no new data yet) rather than stop."""
        if self.interrupted is not None:
            return False
        reason = self.stopped_reason or ""
        return (
            reason == "paused"
            or reason.startswith(SWAP_HOLD)
            or (follow and reason == "no new data")
        )


def _ignore(event: dict[str, Any]) -> None:
    """The event callback of a run nobody listens to."""


def _new_operation(control: dict[str, Any], parent: Manifest | None) -> str | None:
    """The control document's operation id if this is the first commit to apply it (the
    parent neither applied it nor was made by it), else None."""
    op = control.get("operation_id")
    if not isinstance(op, str) or not op:
        return None
    if parent is not None:
        applied = parent.extra.get("control")
        if parent.operation_id == op or (
            isinstance(applied, dict) and applied.get("operation_id") == op
        ):
            return None
    return op


def _backlog(source: Source, offsets: dict[str, int]) -> dict[str, int]:
    """The manifest stats ``backlog_epochs`` and ``backlog_records``: input the source holds
    after `offsets`, when it can tell (capabilities `ReportsBacklog`,
    `ReportsBacklogRecords`). Best effort: a failing report never fails the epoch."""
    reports: list[tuple[str, Callable[[dict[str, int]], int | None]]] = []
    if isinstance(source, ReportsBacklog):
        reports.append(("backlog_epochs", source.backlog))
    if isinstance(source, ReportsBacklogRecords):
        reports.append(("backlog_records", source.backlog_records))
    stats: dict[str, int] = {}
    for stat, report in reports:
        try:
            value = report(offsets)
        except Exception:
            log.warning("source %s: %s failed", source.name, stat, exc_info=True)
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            stats[stat] = int(value)
    return stats


def _applied(control: dict[str, Any], parallelism: int) -> dict[str, Any]:
    """What of the control document this epoch applied (recorded in the manifest)."""
    applied: dict[str, Any] = {"parallelism": parallelism}
    for key in ("stop_after_epoch", "operation_id"):
        if key in control:
            applied[key] = control[key]
    return applied


__all__ = ["EngineError", "EpochResult", "EpochRunner", "MapShare"]
