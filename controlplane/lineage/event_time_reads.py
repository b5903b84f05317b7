"""A snapshot's event time per key group, from the store: the manifest's ``extra.event_time``
(watermark applied and after, partitions, late records, `due`, `timers`) and the open windows
counted in the key groups' state rows.

A windowed job keeps one state row per key with `window_start`, the sorted starts of the key's
open windows (docs/engine.md "Windows"); a key group's open windows are the sum of those lists'
lengths. `due` names every key group with open windows (and the end of its earliest one), so
only those key groups are read. Chunks are immutable, so a chain's count is cached per process;
a snapshot whose due key groups' stored state passes `COUNT_BUDGET_BYTES` is not counted (the
dashboard says so) — the rest of the view needs only the manifest.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from controlplane.applications.models import Application
from controlplane.lineage.state_reads import object_size, read_manifest, repository
from runners.engine.keygroups import operator_index
from runners.engine.state.restore import load_key_group
from snapshots_store import Manifest, StoreError

EXTRA = "event_time"  # the manifest's extra entry (runners.engine.eventtime.watermark.EXTRA)
TIMERS = "timers"  # the timers' entry (runners.engine.eventtime.timers.EXTRA): ``pending``
WINDOW_STARTS = "window_start"
COUNT_BUDGET_BYTES = 64 * 1024**2
_COUNT_CACHE_ENTRIES = 50_000
_counts: OrderedDict[tuple[str, ...], int] = OrderedDict()
_lock = threading.Lock()


@dataclass(frozen=True)
class KeyGroupEventTime:
    """One key group with open windows or pending timers."""

    key_group: int
    task: int
    #: open windows in the key group's state rows (None: not counted)
    open_windows: int | None
    #: the end of its earliest open window (ms; None: no open window)
    earliest_end_ms: int | None
    #: timers pending in it (None: the job records no timers)
    timers: int | None


@dataclass(frozen=True)
class Partition:
    """One watermark partition and the largest event time read from it (the document also
    holds the processing time it last brought records: logical time in a replayable job)."""

    name: str
    max_event_ms: int


@dataclass(frozen=True)
class SnapshotEventTime:
    """What a snapshot of an event-time job records of event time."""

    snapshot_id: str
    watermark_ms: int | None
    applied_ms: int | None
    late_records: int
    partitions: list[Partition]
    window: str
    spec: str
    key_groups: list[KeyGroupEventTime] = field(default_factory=list)
    #: the job records timers (`extra.timers.pending`)
    has_timers: bool = False
    #: why open windows are not counted ("" when they are, or the job has no windows)
    count_note: str = ""

    @property
    def open_windows(self) -> int | None:
        counts = [kg.open_windows for kg in self.key_groups]
        return None if any(c is None for c in counts) else sum(c or 0 for c in counts)

    @property
    def pending_timers(self) -> int | None:
        return sum(kg.timers or 0 for kg in self.key_groups) if self.has_timers else None


def _int_map(raw: Any) -> dict[int, int]:
    if not isinstance(raw, Mapping):
        return {}
    out: dict[int, int] = {}
    for key, value in raw.items():
        try:
            out[int(key)] = int(value)
        except (TypeError, ValueError):
            continue
    return out


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _duration(ms: Any) -> str:
    seconds = int(ms) / 1000
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def window_words(doc: Any) -> str:
    """``{"size_ms", "slide_ms", "mode"}`` in words ("" when not a window)."""
    if not isinstance(doc, Mapping) or "size_ms" not in doc:
        return ""
    size, slide = doc["size_ms"], doc.get("slide_ms", doc["size_ms"])
    shape = f"tumbling {_duration(size)}"
    if slide != size:
        shape = f"{_duration(size)} sliding by {_duration(slide)}"
    return f"{shape}, {doc.get('mode', 'append')} mode"


def spec_words(doc: Any) -> str:
    """``{"column", "delay_ms", "idle_ms"}`` in words."""
    if not isinstance(doc, Mapping) or "column" not in doc:
        return ""
    words = f"column {doc['column']}, delay {_duration(doc.get('delay_ms') or 0)}"
    if doc.get("idle_ms"):
        words += f", idle partitions left out after {_duration(doc['idle_ms'])}"
    return words


def _count(repo: Any, chain: tuple[str, ...], key_columns: list[str]) -> int:
    """Open windows of one key group's chain (cached: chunks never change)."""
    with _lock:
        cached = _counts.get(chain)
        if cached is not None:
            _counts.move_to_end(chain)
            return cached
    table: pa.Table = load_key_group(repo, chain, key_columns, use_cache=False).table
    count = 0
    if WINDOW_STARTS in table.column_names and table.num_rows:
        lengths = pc.list_value_length(table.column(WINDOW_STARTS))
        count = int(pc.sum(lengths).as_py() or 0)
    with _lock:
        _counts[chain] = count
        while len(_counts) > _COUNT_CACHE_ENTRIES:
            _counts.popitem(last=False)
    return count


def _counts_of(
    application: Application, manifest: Manifest, groups: list[int]
) -> tuple[dict[int, int], str]:
    """Open windows per key group of `groups`, and why not ("" when counted)."""
    key = manifest.extra.get("key")
    if not isinstance(key, list) or not key:
        return {}, "the snapshot does not record its key columns, so its state is not read"
    repo = repository(application)
    chains = {g: tuple(manifest.key_groups.get(g, ())) for g in groups}
    stored = sum(object_size(repo, c) or 0 for chain in chains.values() for c in chain)
    if stored > COUNT_BUDGET_BYTES:
        return {}, (
            f"open windows are not counted: the key groups with windows hold "
            f"{stored / 1024**2:.0f} MB of state (the dashboard reads at most "
            f"{COUNT_BUDGET_BYTES // 1024**2} MB per view)"
        )
    try:
        return {g: _count(repo, chain, [str(c) for c in key]) for g, chain in chains.items()}, ""
    except StoreError as exc:
        return {}, f"open windows are not counted: the state cannot be read ({exc})"


def snapshot_event_time(*, application: Application, snapshot_id: str) -> SnapshotEventTime | None:
    """The snapshot's event time (None: it records none). NotFound when the store cannot
    give the manifest."""
    manifest = read_manifest(application, snapshot_id)
    doc = manifest.extra.get(EXTRA)
    if not isinstance(doc, Mapping):
        return None
    due = _int_map(doc.get("due"))
    timer_doc = manifest.extra.get(TIMERS)
    timers_raw = timer_doc.get("pending") if isinstance(timer_doc, Mapping) else None
    timers = _int_map(timers_raw)
    windowed = doc.get("window") is not None
    groups = sorted(set(due) | set(timers))
    counts: dict[int, int] = {}
    note = ""
    if windowed and due:
        counts, note = _counts_of(application, manifest, sorted(due))
    m, p = manifest.max_parallelism, manifest.parallelism
    rows = [
        KeyGroupEventTime(
            key_group=g,
            task=operator_index(g, p, m),
            open_windows=counts.get(g, 0 if g not in due else None) if windowed else None,
            earliest_end_ms=due.get(g),
            timers=timers.get(g, 0) if timers_raw is not None else None,
        )
        for g in groups
    ]
    raw_partitions = doc.get("partitions")
    partitions: Mapping[str, Any] = raw_partitions if isinstance(raw_partitions, Mapping) else {}
    return SnapshotEventTime(
        snapshot_id=snapshot_id,
        watermark_ms=_optional_int(doc.get("watermark")),
        applied_ms=_optional_int(doc.get("applied")),
        late_records=int(doc.get("late") or 0),
        partitions=[
            Partition(str(name), int(v[0]))
            for name, v in sorted(partitions.items())
            if isinstance(v, list | tuple) and len(v) == 2
        ],
        window=window_words(doc.get("window")),
        spec=spec_words(doc.get("spec")),
        key_groups=rows,
        has_timers=timers_raw is not None,
        count_note=note,
    )
