"""Fan-in: one job reading the committed outputs of two or more upstream jobs (docs/webs.md).

Van Kaam's marker merging (N. van Kaam, *Epoch alignment in stateful streams*) lets a job
with several sources close an epoch when the markers of every source have arrived, which
lines epochs up only when every source emits markers at the same rate. Here the upstreams are
independent jobs that commit at their own rates, so the marker is merged from what each
upstream commit records: its **processing time** (the manifest's ``processing_time_ms``: the
driver's clock, or ``epoch * logical_epoch_ms`` for a logical-time job).

**The mapping.** Downstream epoch m reads, from every upstream u, the committed epochs of u
not read yet whose processing time is at or before the **merged marker**

    T_m = min over upstreams u of (processing time of u's newest committed epoch)

— the latest moment every upstream has committed up to. An upstream epoch after T_m waits
for a later downstream epoch; an upstream that commits faster contributes several epochs to
one downstream epoch, a slower one fewer (or none). So every downstream epoch covers the same
span of processing time on every input (up to each upstream's epoch granularity), nothing is
read twice or skipped, and no upstream has to match another's rate. The epoch waits (no empty
epochs) until the slowest upstream commits past what was read. The manifest records T_m and,
per upstream, the epochs and snapshots read (``extra.inputs.<name>``: ``kind: "fan_in"``,
``marker_ms``, ``inputs: {<upstream>: <branch_output document>}``).

Offsets: ``<upstream>/epoch`` and ``<upstream>/snapshot`` per upstream, as
`BranchOutputSource` keeps them for one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from runners.engine.branch_source import (
    EPOCH_PARTITION,
    BranchOutputSource,
    UpstreamEpoch,
    UpstreamRewoundError,
    upstream_epochs,
)
from runners.engine.eventtime.joins import JOIN  # an interval join's sides as upstreams
from runners.engine.sources import Split, SplitData

FAN_IN = "fan_in"


def _sub(committed: Mapping[str, int], name: str) -> dict[str, int]:
    prefix = f"{name}/"
    return {k[len(prefix) :]: v for k, v in committed.items() if k.startswith(prefix)}


@dataclass
class FanInSource:
    """The committed outputs of several upstream branches, merged at the marker (above).

    `inputs` are `BranchOutputSource`s with distinct names (their `name` labels the offsets,
    the mapping and, with `input_column`, each record's upstream)."""

    inputs: Sequence[BranchOutputSource]
    name: str = "inputs"
    #: a column naming each record's upstream (None: no such column)
    input_column: str | None = "_input"
    _marker: int | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        names = [i.name for i in self.inputs]
        if len(names) < 2 or len(set(names)) != len(names) or any("/" in n for n in names):
            raise ValueError(
                f"a fan-in needs two or more upstreams with distinct names without '/': {names}"
            )

    def _input(self, name: str) -> BranchOutputSource:
        for source in self.inputs:
            if source.name == name:
                return source
        raise KeyError(name)

    def _plan(self, committed: Mapping[str, int]) -> tuple[int | None, dict[str, list[Split]]]:
        """(merged marker, splits per upstream); marker None while an upstream has no epoch."""
        per: dict[str, tuple[list[UpstreamEpoch], int]] = {}
        for source in self.inputs:
            sub = _sub(committed, source.name)
            epochs, start, _ = source._start(sub)
            per[source.name] = (epochs, start)
        if any(not epochs for epochs, _ in per.values()):
            return None, {}
        marker = min(epochs[-1].manifest.processing_time_ms for epochs, _ in per.values())
        splits: dict[str, list[Split]] = {}
        for name, (epochs, start) in per.items():
            previous = int(_sub(committed, name).get(EPOCH_PARTITION, 0))
            chosen = []
            for e in epochs[start:]:
                if e.manifest.processing_time_ms > marker:
                    break
                chosen.append(Split(self.name, f"{name}/{EPOCH_PARTITION}", previous, e.epoch,
                                    e.snapshot_id))  # fmt: skip
                previous = e.epoch
            splits[name] = chosen
        return marker, splits

    # -- Source protocol -------------------------------------------------------------------

    def plan(self, committed: Mapping[str, int]) -> list[Split]:
        marker, splits = self._plan(committed)
        self._marker = marker
        return [s for name in sorted(splits) for s in splits[name]]

    def read(self, split: Split) -> SplitData:
        name = split.partition.split("/", 1)[0]
        data = self._input(name).read(
            Split(name, EPOCH_PARTITION, split.start, split.end, split.locator)
        )
        if self.input_column is None:
            return data
        column = pa.array([name] * data.table.num_rows, pa.string())
        return SplitData(data.table.append_column(self.input_column, column), data.dead_letters)

    def retained(self, offsets: Mapping[str, int]) -> str | None:
        for source in self.inputs:
            problem = source.retained(_sub(offsets, source.name))
            if problem is not None:
                return f"{source.name}: {problem}"
        return None

    # -- runner hooks ----------------------------------------------------------------------

    def prepare_epoch(self, control: Mapping[str, Any], epoch: int) -> None:
        """A hot-swap re-points an upstream of the fan-in by the edge name
        ``<fan-in>/<upstream>`` (control document ``repoint``)."""
        points = control.get("repoint")
        points = points if isinstance(points, Mapping) else {}
        for source in self.inputs:
            mine = points.get(f"{self.name}/{source.name}")
            sub = {**control, "repoint": {source.name: mine} if mine is not None else {}}
            source.prepare_epoch(sub, epoch)
            source.aligned = False  # the merged marker decides the boundaries

    def _split_by_input(self, splits: Sequence[Split]) -> Iterator[tuple[str, list[Split]]]:
        for source in self.inputs:
            prefix = f"{source.name}/"
            yield (
                source.name,
                [
                    Split(source.name, EPOCH_PARTITION, s.start, s.end, s.locator)
                    for s in splits
                    if s.partition.startswith(prefix)
                ],
            )

    def end_offsets(self, committed: Mapping[str, int], splits: Sequence[Split]) -> dict[str, int]:
        result = dict(committed)
        for name, mine in self._split_by_input(splits):
            sub = self._input(name).end_offsets(_sub(committed, name), mine)
            result.update({f"{name}/{k}": v for k, v in sub.items()})
        return result

    def upstream_watermarks(self, splits: Sequence[Split]) -> dict[str, dict[str, Any]]:
        """Per upstream read (edge name ``<fan-in>/<upstream>``), the watermark its newest
        epoch read recorded (`PropagatesWatermarks`)."""
        found: dict[str, dict[str, Any]] = {}
        for name, mine in self._split_by_input(splits):
            for doc in self._input(name).upstream_watermarks(mine).values():
                found[f"{self.name}/{name}"] = doc
        return found

    def lineage(self, committed: Mapping[str, int], splits: Sequence[Split]) -> dict[str, Any]:
        return {
            "kind": FAN_IN,
            "marker_ms": self._marker,
            "inputs": {
                name: self._input(name).lineage(_sub(committed, name), mine)
                for name, mine in self._split_by_input(splits)
            },
        }


def fan_in_offsets(offsets: Mapping[str, int], upstream: str) -> dict[str, int]:
    """One upstream's offsets out of a fan-in source's offsets."""
    return _sub(offsets, upstream)


def flatten_inputs(inputs: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(edge source name, branch-output document) for every upstream a manifest's
    ``extra.inputs`` names: a fan-in's upstreams as ``<fan-in>/<upstream>``."""
    for name, doc in sorted(inputs.items()):
        if not isinstance(doc, Mapping):
            continue
        if doc.get("kind") in (FAN_IN, JOIN) and isinstance(doc.get("inputs"), Mapping):
            for sub, inner in sorted(doc["inputs"].items()):
                if isinstance(inner, Mapping):
                    yield f"{name}/{sub}", {**inner, "marker_ms": doc.get("marker_ms")}
        else:
            yield name, doc


__all__ = [
    "FAN_IN",
    "FanInSource",
    "UpstreamRewoundError",
    "fan_in_offsets",
    "flatten_inputs",
    "upstream_epochs",
]
