"""Redis Streams as a source: partition = stream key, offset = position after the last entry read.

An entry id ``<ms>-<seq>`` is the integer ``ms * 1_000_000 + seq`` (ordered like the ids, and
an int64 until the year 2262); a partition's offset is the id just after the last entry read,
so ``XRANGE <offset> +`` replays what is left. Beside it, ``<stream>#entries`` counts the
entries accounted for (read, or already gone when the job started): with the stream's
``entries-added`` counter it tells whether retention (``XTRIM`` / ``MAXLEN`` / ``MINID``)
deleted entries the job has not read, and ``max-deleted-entry-id`` tells the same of ``XDEL``.
Consumer groups are not used: the offsets live in the job's snapshots only.

Each entry holds one JSON object in its field `payload_field` (default ``data``), decoded with
`schema` like a JSON-lines file; anything else becomes a dead letter.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runners.engine.sources import Split, SplitData, decode_json_records
from runners.engine.streams import (
    SourceDataLostError,
    StartingPosition,
    check_bounds,
    share,
)

SEQ_LIMIT = 1_000_000
COUNT_SUFFIX = "#entries"
PAGE = 10_000

_clients: dict[str, Any] = {}
#: (id, payload size) of up to ARGV[2] entries from id ARGV[1]: planning needs no payloads
_SIZES = """
local entries = redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', tonumber(ARGV[2]))
local out = {}
for _, entry in ipairs(entries) do
  local size = 0
  local fields = entry[2]
  for i = 1, #fields, 2 do
    if fields[i] == ARGV[3] then
      size = string.len(fields[i + 1])
      break
    end
  end
  out[#out + 1] = entry[1]
  out[#out + 1] = size
end
return out
"""


def encode_id(entry_id: bytes | str) -> int:
    """The offset of a stream entry id ``ms-seq``."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    if not (ms.isdigit() and (seq == "" or seq.isdigit())):
        raise ValueError(f"{text!r} is not a stream entry id <ms>-<seq>")
    if int(seq or 0) >= SEQ_LIMIT:
        raise ValueError(f"entry id {text}: sequence numbers of {SEQ_LIMIT} and more are refused")
    return int(ms) * SEQ_LIMIT + int(seq or 0)


def decode_id(offset: int) -> str:
    """The stream entry id of an offset (inverse of `encode_id`)."""
    return f"{offset // SEQ_LIMIT}-{offset % SEQ_LIMIT}"


def _client(url: str) -> Any:
    """A client per URL and process whose XRANGE returns the server's reply as it is (flat
    field lists, no dict per entry: reading is the hot path)."""
    if url not in _clients:
        import redis

        client = redis.Redis.from_url(url, socket_timeout=30, socket_connect_timeout=10)
        client.set_response_callback("XRANGE", lambda response, **_: response)
        _clients[url] = client
    return _clients[url]


def _field(fields: Sequence[bytes], name: bytes) -> bytes | None:
    """The value of `name` in a flat ``[field, value, …]`` list, None when absent."""
    for i in range(0, len(fields) - 1, 2):
        if fields[i] == name:
            return fields[i + 1]
    return None


@dataclass(frozen=True)
class _Head:
    """What the stream says about itself (XINFO STREAM), None fields for a missing key."""

    exists: bool
    added: int = 0
    length: int = 0
    first: int = 0
    last_generated: int = 0
    max_deleted: int = 0


def _head(r: Any, stream: str) -> _Head:
    import redis

    try:
        info = r.xinfo_stream(stream)
    except redis.ResponseError as exc:
        if "no such key" in str(exc):
            return _Head(False)
        raise
    first_entry = info.get("first-entry")
    first = encode_id(first_entry[0]) if first_entry else encode_id(info["last-generated-id"]) + 1
    return _Head(
        True,
        added=int(info["entries-added"]),
        length=int(info["length"]),
        first=first,
        last_generated=encode_id(info["last-generated-id"]),
        max_deleted=encode_id(info["max-deleted-entry-id"]),
    )


@dataclass
class RedisStreamSource:
    """Entries of one or more Redis streams (`streams`, one partition each) at `url`.

    `start` is where a stream the snapshot has not read yet begins (`StartingPosition`:
    earliest, latest, ``offset:<ms>-<seq>`` or ``timestamp:<ms>``). One epoch reads at most
    `max_records_per_epoch` entries and `max_bytes_per_epoch` bytes of payload (each of the n
    streams gets 1/n of each bound); `records_per_split` entries make one split (task input).
    """

    url: str
    streams: Sequence[str]
    schema: Mapping[str, str]
    payload_field: str = "data"
    required: Sequence[str] = ()
    start: str = "earliest"
    max_records_per_epoch: int | None = 100_000
    max_bytes_per_epoch: int | None = None
    records_per_split: int = 50_000
    name: str = "redis"
    _start: StartingPosition = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.streams = list(self.streams)
        check_bounds(
            self.streams, self.max_records_per_epoch, self.max_bytes_per_epoch,
            self.records_per_split,
        )  # fmt: skip
        if any(s.endswith(COUNT_SUFFIX) for s in self.streams):
            raise ValueError(f"stream names may not end in {COUNT_SUFFIX!r}")
        self._start = StartingPosition.parse(self.start)
        if self._start.kind == "offset":
            encode_id(self._start.value)

    def describe(self, stream: str) -> str:
        return f"Redis stream {stream!r}"

    # -- positions ---------------------------------------------------------------------------

    def _count_from(self, r: Any, stream: str, position: int) -> int:
        """How many entries the stream holds at ids >= position."""
        count, cursor = 0, decode_id(position)
        while True:
            page = r.xrange(stream, cursor, "+", count=PAGE)
            count += len(page)
            if len(page) < PAGE:
                return count
            cursor = decode_id(encode_id(page[-1][0]) + 1)

    def _resolve(self, r: Any, stream: str, head: _Head) -> tuple[int, int]:
        """(position, entries accounted for) where a stream not read yet starts."""
        kind = self._start.kind
        if not head.exists:
            position = {"timestamp": int(self._start.value or 0) * SEQ_LIMIT}.get(kind, 0)
            if kind == "offset":
                position = encode_id(self._start.value)
            return position, 0
        if kind == "earliest":
            return 0, head.added - head.length
        if kind == "latest":
            return head.last_generated + 1, head.added
        if kind == "timestamp":
            position = int(self._start.value) * SEQ_LIMIT
        else:
            position = encode_id(self._start.value)
        return position, head.added - self._count_from(r, stream, position)

    def _lost(self, stream: str, head: _Head, position: int, accounted: int) -> str | None:
        """What the stream deleted that a reader at (position, accounted) still needs."""
        if not head.exists:
            if position == 0 and accounted == 0:
                return None
            return (
                f"{self.describe(stream)} no longer exists, but the snapshot resumes at entry "
                f"{decode_id(position)} after {accounted} entries: entries it had not read may "
                "have been deleted with it"
            )
        if head.max_deleted >= position and head.max_deleted > 0:
            return (
                f"{self.describe(stream)}: entry {decode_id(head.max_deleted)} was deleted (XDEL) "
                f"but the snapshot resumes at {decode_id(position)}, so it was never read"
            )
        missing = head.added - accounted - head.length
        if head.first > position and missing > 0:
            return (
                f"{self.describe(stream)}: retention deleted {missing} entries the snapshot had "
                f"not read (it resumes at {decode_id(position)}; the oldest entry left is "
                f"{decode_id(head.first)})"
            )
        return None

    # -- Source protocol ---------------------------------------------------------------------

    def plan(self, committed: Mapping[str, int]) -> list[Split]:
        r = _client(self.url)
        splits: list[Split] = []
        max_records = share(self.max_records_per_epoch, len(self.streams))
        max_bytes = share(self.max_bytes_per_epoch, len(self.streams))
        for stream in self.streams:
            head = _head(r, stream)
            known = stream in committed
            if known:
                position = int(committed[stream])
                accounted = int(committed.get(stream + COUNT_SUFFIX, 0))
            else:
                position, accounted = self._resolve(r, stream, head)
            if known:
                problem = self._lost(stream, head, position, accounted)
                if problem is not None:
                    raise SourceDataLostError(problem + "; the job stops rather than skip them")
            ranges = self._ranges(r, stream, head, position, max_records, max_bytes)
            if not ranges and not known:
                # commit where a new stream starts (so `latest` means the first plan's tail)
                ranges = [(position, position, 0)]
            for a, b, count in ranges:
                locator = json.dumps({"count": count, "before": accounted})
                splits.append(Split(self.name, stream, a, b, locator))
                accounted += count
        return splits

    def _entries(
        self, r: Any, stream: str, position: int, limit: int | None
    ) -> Iterator[tuple[int, int]]:
        """``(offset, payload bytes)`` of the entries from `position`, at most `limit`."""
        sizes = r.register_script(_SIZES)
        cursor, seen = position, 0
        while limit is None or seen < limit:
            want = PAGE if limit is None else min(PAGE, limit - seen)
            flat = sizes(keys=[stream], args=[decode_id(cursor), want, self.payload_field])
            for i in range(0, len(flat), 2):
                cursor = encode_id(flat[i]) + 1
                yield cursor - 1, int(flat[i + 1])
            seen += len(flat) // 2
            if len(flat) // 2 < want:
                return

    def _ranges(
        self,
        r: Any,
        stream: str,
        head: _Head,
        position: int,
        max_records: int | None,
        max_bytes: int | None,
    ) -> list[tuple[int, int, int]]:
        """``(start, end, entries)`` of the next splits of a stream from `position`."""
        if not head.exists or head.last_generated < position:
            return []
        ranges: list[tuple[int, int, int]] = []
        start = end = position
        count = total_bytes = 0
        for offset, payload in self._entries(r, stream, position, max_records):
            if max_bytes is not None and total_bytes and total_bytes + payload > max_bytes:
                break
            total_bytes += payload
            count, end = count + 1, offset + 1
            if count >= self.records_per_split:
                ranges.append((start, end, count))
                start, count = end, 0
        if count:
            ranges.append((start, end, count))
        return ranges

    def read(self, split: Split, required: Sequence[str] = ()) -> SplitData:
        expected = int(json.loads(split.locator)["count"]) if split.locator else None
        r = _client(self.url)
        records: list[tuple[int, bytes]] = []
        dead_missing: list[tuple[int, bytes]] = []
        key = self.payload_field.encode()
        cursor, last = split.start, split.end - 1
        while cursor <= last and split.end > split.start:
            page = r.xrange(split.partition, decode_id(cursor), decode_id(last), count=PAGE)
            for entry_id, fields in page:
                offset = encode_id(entry_id)
                payload = _field(fields, key)
                if payload is not None:
                    records.append((offset, payload))
                else:
                    pairs = zip(fields[::2], fields[1::2], strict=False)
                    entry = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace")
                             for k, v in pairs}  # fmt: skip
                    dead_missing.append((offset, json.dumps(entry).encode()))
                cursor = offset + 1
            if len(page) < PAGE:
                break
        if expected is not None and len(records) + len(dead_missing) != expected:
            raise SourceDataLostError(
                f"{self.describe(split.partition)}: {expected} entries were planned in "
                f"[{decode_id(split.start)}, {decode_id(split.end)}) but "
                f"{len(records) + len(dead_missing)} are left: entries were deleted while the "
                "epoch ran"
            )
        data = decode_json_records(
            records, self.schema, (*self.required, *required), split.source, split.partition
        )
        for offset, raw in dead_missing:
            data.dead_letters.append(
                _dead(split, offset, f"entry has no field {self.payload_field!r}", raw)
            )
        return data

    def end_offsets(self, committed: Mapping[str, int], splits: Sequence[Split]) -> dict[str, int]:
        """Positions after the epoch, and the entries accounted for per stream."""
        result = dict(committed)
        for split in splits:
            meta = json.loads(split.locator)
            result[split.partition] = max(result.get(split.partition, 0), split.end)
            count_key = split.partition + COUNT_SUFFIX
            result[count_key] = max(result.get(count_key, 0), meta["before"] + meta["count"])
        return result

    def backlog_records(self, offsets: Mapping[str, int]) -> int:
        """Entries added to the streams and not read yet (retention aside)."""
        r = _client(self.url)
        waiting = 0
        for stream in self.streams:
            head = _head(r, stream)
            if head.exists and stream in offsets:
                waiting += max(0, head.added - int(offsets.get(stream + COUNT_SUFFIX, 0)))
        return waiting

    def backlog(self, offsets: Mapping[str, int]) -> int:
        """Epochs of input waiting after `offsets` (per `max_records_per_epoch`)."""
        waiting = self.backlog_records(offsets)
        bound = self.max_records_per_epoch
        return -(-waiting // bound) if bound else int(waiting > 0)

    def retained(self, offsets: Mapping[str, int]) -> str | None:
        r = _client(self.url)
        for stream, position in sorted(offsets.items()):
            if stream.endswith(COUNT_SUFFIX):
                continue
            accounted = int(offsets.get(stream + COUNT_SUFFIX, 0))
            problem = self._lost(stream, _head(r, stream), int(position), accounted)
            if problem is not None:
                return problem
        return None


def _dead(split: Split, offset: int, reason: str, raw: bytes) -> Any:
    from runners.engine.sources import DeadLetter

    return DeadLetter(split.source, split.partition, offset, reason, raw.decode("utf-8", "replace"))


__all__ = ["RedisStreamSource", "decode_id", "encode_id"]
