"""How an epoch's records reach the task that owns their key group.

- ``scan``: p tasks, one stage; every task reads the whole epoch, hashes every key and keeps
  its own key groups. No exchange, but each extra task adds a full read and hash.
- ``split``: the read itself is split. The epoch's splits are divided into pieces (a source's
  optional capability `Divisible`: `ParquetDirectory` cuts at row-group boundaries);
  each of the p tasks reads only its pieces, hashes them and sends each owner its rows (the
  projected input columns, Arrow IPC files: exchange.py, no Python row loop), then concatenates
  what it receives in input order and aggregates it exactly as a scan task would. So the state,
  chunks and outputs are byte-identical to the scan's, for any aggregation (float sums too).
- ``shuffle``: one map task per split reads it, routes and partially aggregates it per key
  (the exchange carries at most one row per key and split), the reducers combine partials.

``auto`` (the default) picks ``scan`` for one task, ``split`` when there are several tasks,
the epoch's input comes in several pieces (several splits, or a split a source can divide) and
there is an exchange directory (the runner passes 1 piece otherwise), else
``scan`` up to ``scan_max_parallelism`` tasks and ``shuffle`` above.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runners.engine.sources import Divisible, Source, Split

ROUTINGS = ("auto", "scan", "split", "shuffle")


@dataclass(frozen=True)
class Piece:
    """One map task's share of the input under the split routing: rows ``[first_row,
    first_row + rows)`` of split `split_index` (offsets of a divisible source count rows)."""

    split_index: int
    part: int
    split: Split
    first_row: int


def pieces(source: Source, splits: Sequence[Split], parallelism: int) -> list[Piece]:
    """The epoch's splits as read pieces: each split divided into ceil(p / splits) pieces when
    the source can divide it (capability `sources.Divisible`), else kept whole."""
    per_split = -(-parallelism // max(1, len(splits)))
    divide = source.divide if isinstance(source, Divisible) and per_split > 1 else None
    result: list[Piece] = []
    for index, split in enumerate(splits):
        parts = [split] if divide is None else divide(split, per_split)
        result.extend(
            Piece(index, part, piece, piece.start - split.start) for part, piece in enumerate(parts)
        )
    return result


def choose(routing: str, parallelism: int, pieces_count: int, scan_max_parallelism: int) -> str:
    """The routing an epoch runs with (`routing` as the runner was asked: auto or a fixed one)."""
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, not {routing!r}")
    if routing != "auto":
        return routing
    if parallelism == 1:
        return "scan"  # one task reads everything once anyway; an exchange would only add cost
    if pieces_count > 1:
        return "split"
    return "scan" if parallelism <= scan_max_parallelism else "shuffle"
