"""What the two log destinations (Redis Streams, RabbitMQ Streams) share: record ids derived
from the epoch, the generation that keeps them increasing after a rollback, the encoding of an
epoch's rows, and the refusal to unpublish.

A record's *position* is ``slot * SLOT + index``: `index` counts the epoch's rows over its
parts in their stored order (the parts the pending record names, so a restart at another
parallelism numbers them the same way), and ``slot = generation + epoch``. Redis uses the
position as the entry id ``<position // 10**6>-<position % 10**6>``, RabbitMQ as the
publishing id of a named producer; both refuse a record at or below the last one they hold, so
repeating an epoch's commit adds only what is missing.

The *generation* is 0 until a rollback: the branch then starts again at an epoch whose ids the
log already holds (published records stay published), and the epoch's prepare moves the
generation up so that its ids start after the log's last record. It is kept in the sink's
pending record in the snapshot, so a restart publishes under the same ids.
"""

from __future__ import annotations

from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from runners.engine.destinations.fields import FromConfig
from runners.engine.sinks import SINKS, EpochOutput

#: positions per slot (an epoch of one generation)
SLOT = 10**12


class CannotUnpublishError(RuntimeError):
    """A log cannot take back records it published: a rollback must be confirmed by an
    operator who accepts that the records of the abandoned epochs stay in the log."""


def identity(namespace: str, branch: str) -> str:
    """The branch identity a destination records: who writes it."""
    return f"{namespace}/{branch}"


def position(generation: int, epoch: int, index: int) -> int:
    return (generation + epoch) * SLOT + index


def generation(epoch: int, parent: int, top: int) -> int:
    """The generation for `epoch`: the parent snapshot's (`parent`), moved up when the log's
    last record (`top`, a position; 0 for none) is at or past the epoch's first id."""
    return max(parent, top // SLOT - epoch + 1, 0)


def parent_generation(output: EpochOutput, sink: str) -> int:
    """The generation the branch head's pending record of `sink` used (0 for none)."""
    head = output.repo.read_ref(f"heads/{output.branch}")
    if head is None:
        return 0
    entry = (output.repo.read_manifest(head.target).extra.get(SINKS) or {}).get(sink)
    staged = entry.get("staged") if isinstance(entry, dict) else None
    return int(staged.get("generation", 0)) if isinstance(staged, dict) else 0


def stage(
    output: EpochOutput, sink: str, stream: str, top: int
) -> tuple[list[bytes], dict[str, Any]]:
    """The epoch's encoded rows and the pending record of a log sink: the stream, the writer,
    the epoch, the generation (from the log's last position `top`) and the record count."""
    rows = encoded_rows(output)
    gen = generation(output.epoch, parent_generation(output, sink), top)
    record = {"stream": stream, "identity": identity(output.namespace, output.branch),
              "epoch": output.epoch, "generation": gen, "records": len(rows)}  # fmt: skip
    return rows, record


def encoded_rows(output: EpochOutput) -> list[bytes]:
    """The epoch's rows as JSON objects, over its parts in order (bytes, decimals as text)."""
    return [row for part in output.parts for table in output.tables(part)
            for row in json_lines(table)]  # fmt: skip


#: a string a JSON text must escape: a quote, a backslash or a control character
_ESCAPE = r'["\\\x00-\x1f]'


def json_lines(table: pa.Table) -> list[bytes]:
    """Each row of `table` as a compact JSON object, byte for byte what ``orjson.dumps`` of
    the row's dict gives. Integer, boolean and string columns (strings needing no escape) are
    formatted with Arrow's vectorised kernels; any other table row by row with orjson."""
    pieces: list[Any] = []
    for index, (name, column) in enumerate(zip(table.column_names, table.columns, strict=True)):
        text = _json_values(column.combine_chunks())
        if text is None:
            return [orjson.dumps(row, default=str) for row in table.to_pylist()]
        pieces += [("{" if index == 0 else ",") + orjson.dumps(name).decode() + ":", text]
    if not pieces:
        return [b"{}"] * table.num_rows
    joined = pc.binary_join_element_wise(*pieces, "}", "")
    return joined.cast(pa.binary()).to_pylist()  # type: ignore[no-any-return]


def _json_values(column: pa.Array) -> pa.Array | None:
    """The column's values as JSON texts, None for a type or value this does not format."""
    kind = column.type
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        text = pc.cast(column, pa.string())
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        column = column.cast(pa.string())
        if pc.any(pc.match_substring_regex(column, _ESCAPE)).as_py():
            return None
        text = pc.binary_join_element_wise('"', column, '"', "")
    else:
        return None
    return pc.fill_null(text, "null")


class LogSink(FromConfig):
    """What the log sinks share beside their config: they cannot unpublish, and what they
    prepare (each epoch's encoded rows) is a cache of the store's output."""

    name: str
    _prepared: dict[tuple[str, str, int], list[bytes]]

    def forget_staged(self) -> None:
        """Drop the prepared rows: an epoch committed later is encoded again from the store
        (the catch-up driver, staged_catchup.py, while the destination is down)."""
        self._prepared.clear()

    def rollback_to(self, epoch: int, *, namespace: str = "", branch: str = "") -> None:
        """Always `CannotUnpublishError`: the core asks the operator to confirm; the branch's
        next epochs are then published after the abandoned ones (a new generation)."""
        raise CannotUnpublishError(
            f"sink {self.name!r} ({self.KIND}) cannot unpublish: the records of the epochs "
            f"after {epoch} stay in the log, where readers may have consumed them; confirm the "
            "rollback to keep them there (the branch's next epochs are published after them, "
            "under new ids)"
        )


__all__ = [
    "SLOT",
    "CannotUnpublishError",
    "LogSink",
    "encoded_rows",
    "generation",
    "identity",
    "parent_generation",
    "position",
    "stage",
]
