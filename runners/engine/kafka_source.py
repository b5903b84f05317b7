"""Kafka as a source: partition = ``<topic>:<partition>``, offset = the Kafka offset after the
last record read (through `confluent-kafka`).

An epoch reads ``[snapshot offset, planned end)`` of every topic partition, where the end is
the partition's end when the epoch was planned (the last stable offset with
``read_committed``, the default, so records of open or aborted transactions are never read)
capped by the epoch's bounds. The offsets are recorded in the epoch's manifest; the consumer
group's committed offsets are never read or written (like Spark's and Flink's Kafka sources),
so several jobs and forks read the same topics independently.

Topics are named (`topics`) or matched by a regular expression (`pattern`); every plan lists
the cluster's topics again, so partitions added to a topic and new topics matching the pattern
are read from the next epoch on (from their earliest record). The partition's earliest offset
tells whether retention deleted records the snapshot has not read: planning then raises
`SourceDataLostError`. Each record value is one JSON object decoded with `schema` like a
JSON-lines file; anything else (a tombstone, bad JSON, a missing key) becomes a dead letter.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runners.engine.kafka_client import (
    KafkaError,
    admin_types,
    ask,
    check_bootstrap,
    check_config,
    settings,
)
from runners.engine.sources import DeadLetter, Split, SplitData, decode_json_records
from runners.engine.streams import SourceDataLostError, StartingPosition, share

READ_TIMEOUT_S = 120.0
#: records fetched per consume() call inside a task, and the longest wait of one call
BATCH = 10_000
POLL_S = 0.1
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
_consumers: dict[str, Any] = {}


def partition_name(topic: str, partition: int) -> str:
    """A partition's name in the offsets: ``<topic>:<partition>`` (``:`` is not allowed in
    topic names, so the name parses back)."""
    return f"{topic}:{partition}"


def parse_partition(name: str) -> tuple[str, int]:
    """(topic, partition) of a ``<topic>:<partition>`` name."""
    topic, _, number = name.rpartition(":")
    if not topic or not number.isdigit():
        raise ValueError(f"{name!r} is not a Kafka partition name <topic>:<partition>")
    return topic, int(number)


def _start(spec: str | Mapping[str, int]) -> StartingPosition | dict[str, int]:
    """A start position, or offsets per ``<topic>:<partition>`` (checked)."""
    if isinstance(spec, Mapping):
        out: dict[str, int] = {}
        for name, offset in spec.items():
            parse_partition(name)
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise ValueError(f"start offset of {name}: a non-negative integer, not {offset!r}")
            out[name] = offset
        return out
    position = StartingPosition.parse(spec)
    if position.kind == "offset" and not position.value.isdigit():
        raise ValueError(f"start {spec!r}: offset:<n> needs a non-negative integer")
    return position


@dataclass
class KafkaSource:
    """Records of Kafka topics at `bootstrap_servers`: `topics` by name, or every topic whose
    name matches `pattern` (a regular expression matched against the whole name).

    `start` says where a partition the snapshot has not read yet begins at the job's first
    plan: ``earliest``, ``latest``, ``offset:<n>`` (every partition), ``timestamp:<ms>`` (the
    first record at or after it), or a mapping ``{"<topic>:<partition>": offset}`` (others
    earliest). Partitions that appear later (added partitions, new matching topics) start at
    their earliest record. One epoch reads at most `max_records_per_epoch` offsets and
    `max_bytes_per_epoch` bytes of values (each of the n partitions gets 1/n of each bound);
    `records_per_split` offsets make one split (task input). `config`: further librdkafka
    settings (security, SASL, TLS).
    """

    bootstrap_servers: str
    topics: Sequence[str]
    schema: Mapping[str, str]
    required: Sequence[str] = ()
    pattern: str | None = None
    start: str | Mapping[str, int] = "earliest"
    max_records_per_epoch: int | None = 100_000
    max_bytes_per_epoch: int | None = None
    records_per_split: int = 50_000
    isolation_level: str = "read_committed"
    config: Mapping[str, Any] = field(default_factory=dict)
    name: str = "kafka"
    _start: StartingPosition | dict[str, int] = field(init=False, repr=False, compare=False)
    #: partition -> end offset seen by the latest plan (driver only; the backlog)
    _tails: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.bootstrap_servers = check_bootstrap(self.bootstrap_servers)
        self.topics = list(self.topics)
        if bool(self.topics) == bool(self.pattern):
            raise ValueError(
                "give Kafka topics by name (topics=[…]) or a pattern (pattern='clicks-.*'), "
                f"exactly one of them (got topics={self.topics!r}, pattern={self.pattern!r})"
            )
        for topic in self.topics:
            if not isinstance(topic, str) or not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", topic):
                raise ValueError(f"topic {topic!r}: Kafka topic names are 1-249 of [A-Za-z0-9._-]")
        if len(set(self.topics)) != len(self.topics):
            raise ValueError(f"topics {self.topics} names a topic twice")
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(
                    f"pattern {self.pattern!r} is not a regular expression: {exc}"
                ) from None
        for name, value in (("max_records_per_epoch", self.max_records_per_epoch),
                            ("max_bytes_per_epoch", self.max_bytes_per_epoch)):  # fmt: skip
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer or None, not {value!r}")
        if not isinstance(self.records_per_split, int) or self.records_per_split < 1:
            raise ValueError(
                f"records_per_split must be a positive integer, not {self.records_per_split!r}"
            )
        if self.isolation_level not in ISOLATION_LEVELS:
            raise ValueError(
                f"isolation_level must be read_committed or read_uncommitted, "
                f"not {self.isolation_level!r}"
            )
        self.config = check_config(self.config)
        self._start = _start(self.start)

    def describe(self, partition: str) -> str:
        topic, number = parse_partition(partition)
        return f"Kafka topic {topic!r} partition {number}"

    # -- driver side -------------------------------------------------------------------------

    def partitions(self) -> list[str]:
        """The ``<topic>:<partition>`` names the source reads now (sorted)."""
        from runners.engine.kafka_client import topic_partitions

        counts = topic_partitions(self.bootstrap_servers, self.config)
        if self.pattern is not None:
            matcher = re.compile(self.pattern)
            topics = [t for t in counts if matcher.fullmatch(t)]
        else:
            topics = [t for t in self.topics if t in counts]
        return sorted(
            (partition_name(t, p) for t in topics for p in range(counts[t])),
            key=parse_partition,
        )

    def _offsets(self, names: Sequence[str], spec: Any, what: str) -> dict[str, int]:
        """One list-offsets request for `names` (OffsetSpec `spec`): partition -> offset."""
        from confluent_kafka import IsolationLevel, TopicPartition

        if not names:
            return {}
        request = {TopicPartition(*parse_partition(n)): spec for n in names}
        level = IsolationLevel[self.isolation_level.upper()]
        answers = ask(
            self.bootstrap_servers, self.config,
            lambda client: client.list_offsets(request, isolation_level=level),
            what,
        )  # fmt: skip
        return {partition_name(tp.topic, tp.partition): int(r.offset) for tp, r in answers.items()}

    def _edges(self, names: Sequence[str]) -> tuple[dict[str, int], dict[str, int]]:
        """(earliest, end) offsets of the partitions."""
        spec = admin_types().OffsetSpec
        return (
            self._offsets(names, spec.earliest(), "earliest offset of"),
            self._offsets(names, spec.latest(), "end offset of"),
        )

    def _resolve(
        self, new: Sequence[str], first_plan: bool, earliest: Mapping[str, int],
        end: Mapping[str, int],
    ) -> dict[str, int]:  # fmt: skip
        """Where partitions the snapshot has not read start."""
        start = self._start
        if not first_plan:  # discovered later: everything in it came after the job started
            return {n: earliest[n] for n in new}
        if isinstance(start, dict):
            return {n: start.get(n, earliest[n]) for n in new}
        if start.kind == "earliest":
            return {n: earliest[n] for n in new}
        if start.kind == "latest":
            return {n: end[n] for n in new}
        if start.kind == "offset":
            return {n: int(start.value) for n in new}
        found = self._offsets(
            new, admin_types().OffsetSpec.for_timestamp(int(start.value)), "offset by time of"
        )
        # -1: no record at or after the time yet: start at the end
        return {n: end[n] if found[n] < 0 else found[n] for n in new}

    def _lost(self, partition: str, position: int, earliest: int | None) -> str | None:
        if earliest is None:
            if position == 0:
                return None
            return (
                f"{self.describe(partition)} no longer exists, but the snapshot resumes at "
                f"offset {position}: records it had not read may have been deleted with it"
            )
        if earliest <= position:
            return None
        return (
            f"{self.describe(partition)}: retention deleted offsets {position} to "
            f"{earliest - 1} ({earliest - position} records) that the snapshot had not read "
            f"(it resumes at offset {position}; the oldest offset left is {earliest})"
        )

    def plan(self, committed: Mapping[str, int]) -> list[Split]:
        names = self.partitions()
        earliest, end = self._edges(names)
        gone = sorted(set(committed) - set(names), key=parse_partition)
        for partition in gone:
            problem = self._lost(partition, int(committed[partition]), None)
            if problem is not None:
                raise SourceDataLostError(problem + "; the job stops rather than skip them")
        new = [n for n in names if n not in committed]
        positions = {n: int(committed[n]) for n in names if n in committed}
        for partition, position in positions.items():
            problem = self._lost(partition, position, earliest[partition])
            if problem is not None:
                raise SourceDataLostError(problem + "; the job stops rather than skip them")
        positions.update(self._resolve(new, not committed, earliest, end))
        self._tails = dict(end)
        max_records = share(self.max_records_per_epoch, len(names))
        max_bytes = share(self.max_bytes_per_epoch, len(names))
        splits: list[Split] = []
        for partition in names:
            position = positions[partition]
            if partition in new and position < earliest[partition]:
                position = earliest[partition]  # an offset start below what is retained
            stop = max(position, end[partition])
            if max_records is not None:
                stop = min(stop, position + max_records)
            if max_bytes is not None and stop > position:
                stop = self._byte_cut(partition, position, stop, max_bytes)
            if stop <= position:
                if partition in new:  # commit where a new partition starts
                    splits.append(Split(self.name, partition, position, position))
                continue
            step = self.records_per_split
            splits.extend(
                Split(self.name, partition, a, min(stop, a + step))
                for a in range(position, stop, step)
            )
        return splits

    def _byte_cut(self, partition: str, start: int, end: int, max_bytes: int) -> int:
        """The end of the longest range from `start` whose values fit `max_bytes` (>= 1)."""
        total, cut = 0, start
        for offset, value in self._records(partition, start, end):
            size = len(value or b"")
            if total and total + size > max_bytes:
                break
            total, cut = total + size, offset + 1
        return max(cut, start + 1)

    # -- task side ---------------------------------------------------------------------------

    def _consumer(self) -> Any:
        """This process's consumer for the source's servers (assigned per read, never
        subscribed: it joins no group and commits nothing)."""
        from confluent_kafka import Consumer

        key = json.dumps([self.bootstrap_servers, self.isolation_level, self.config],
                         sort_keys=True, default=str)  # fmt: skip
        if key not in _consumers:
            _consumers[key] = Consumer(
                settings(
                    self.bootstrap_servers, self.config, group_id="epochal-unused",
                    enable_auto_commit=False, enable_partition_eof=True,
                    auto_offset_reset="error", isolation_level=self.isolation_level,
                    fetch_wait_max_ms=50, max_partition_fetch_bytes=8 << 20,
                    fetch_max_bytes=64 << 20,
                )
            )  # fmt: skip
        return _consumers[key]

    def _records(self, partition: str, start: int, end: int) -> list[tuple[int, bytes | None]]:
        """``(offset, value)`` of the records at offsets ``[start, end)`` (offsets of
        transaction markers and aborted records are skipped)."""
        from confluent_kafka import KafkaError as Code
        from confluent_kafka import TopicPartition

        topic, number = parse_partition(partition)
        consumer = self._consumer()
        consumer.assign([TopicPartition(topic, number, start)])
        got: list[tuple[int, bytes | None]] = []
        deadline = time.monotonic() + READ_TIMEOUT_S
        try:
            position = start
            while position < end:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{self.describe(partition)}: offsets {start} to {end - 1} were planned "
                        f"but reading stopped at {position} within {READ_TIMEOUT_S:.0f} s"
                    )
                # consume() waits until it has this many messages or the timeout: ask for
                # what the range still holds at most (fewer when markers sit in it)
                batch = consumer.consume(min(BATCH, end - position), POLL_S)
                for m in batch:
                    error = m.error()
                    if error is None:
                        offset = int(m.offset() or 0)
                        if offset >= end:
                            position = end
                            break
                        got.append((offset, m.value()))
                        position = offset + 1
                    elif error.code() == Code._PARTITION_EOF:
                        at = int(m.offset() or 0)
                        if at < end:
                            raise SourceDataLostError(
                                f"{self.describe(partition)} ends at offset {at} but offsets "
                                f"up to {end - 1} were planned: the topic was deleted and "
                                "created again"
                            )
                        position = end
                    elif error.code() in (Code.OFFSET_OUT_OF_RANGE, Code._AUTO_OFFSET_RESET):
                        raise SourceDataLostError(
                            f"{self.describe(partition)}: offset {position} is no longer "
                            f"retained (records deleted while the epoch ran): {error.str()}"
                        )
                    elif error.fatal() or not error.retriable():
                        raise KafkaError(f"read {self.describe(partition)}: {error.str()}")
                if not batch:  # transaction markers at the end carry no record
                    position = max(
                        position, int(consumer.position([TopicPartition(topic, number)])[0].offset)
                    )
        finally:
            consumer.unassign()
        return got

    def watermark_partition(self, partition: str) -> str:
        """Each Kafka partition holds an event-time job's watermark back on its own
        (sources.PartitionsEventTime)."""
        return partition

    def read(self, split: Split, required: Sequence[str] = ()) -> SplitData:
        """The records of the split; `required` fields (the job's key columns) must be
        present and non-null, as the source's own `required`."""
        records: list[tuple[int, bytes]] = []
        dead: list[DeadLetter] = []
        if split.end > split.start:
            for offset, value in self._records(split.partition, split.start, split.end):
                if value is None:
                    reason = "record has no value (a tombstone)"
                    dead.append(DeadLetter(split.source, split.partition, offset, reason, ""))
                else:
                    records.append((offset, value))
        must = tuple(dict.fromkeys((*self.required, *required)))
        data = decode_values(records, self.schema, must, split.source, split.partition)
        data.dead_letters.extend(dead)
        return data

    # -- the control plane's questions -------------------------------------------------------

    def backlog_records(self, offsets: Mapping[str, int]) -> int | None:
        """Offsets after `offsets` up to the partitions' ends as of the latest plan (no extra
        round trip before a commit); None before the first plan."""
        if not self._tails:
            return None
        return sum(max(0, tail - int(offsets.get(p, tail))) for p, tail in self._tails.items())

    def backlog(self, offsets: Mapping[str, int]) -> int | None:
        """Epochs of input waiting after `offsets` (per `max_records_per_epoch`)."""
        waiting = self.backlog_records(offsets)
        if waiting is None:
            return None
        bound = self.max_records_per_epoch
        return -(-waiting // bound) if bound else int(waiting > 0)

    def retained(self, offsets: Mapping[str, int]) -> str | None:
        earliest = admin_types().OffsetSpec.earliest()
        live = set(self.partitions())
        for partition, position in sorted(offsets.items()):
            if partition not in live:
                problem = self._lost(partition, int(position), None)
            else:
                first = self._offsets([partition], earliest, "earliest offset of")
                problem = self._lost(partition, int(position), first[partition])
            if problem is not None:
                return problem
        return None


def decode_values(
    records: Sequence[tuple[int, bytes]],
    schema: Mapping[str, str],
    required: Sequence[str],
    source: str,
    partition: str,
) -> SplitData:
    """JSON object values ``(offset, bytes)`` as an Arrow table of `schema`'s columns, like
    `sources.decode_json_records` and equal to it: when every value is one JSON object whose
    fields have the schema's types and whose `required` fields are there (the common case),
    all are parsed at once by pyarrow's JSON reader; otherwise record by record, which turns
    each bad record into a dead letter naming what is wrong."""
    if records:
        table = _parse_all(records, schema)
        if table is not None and all(
            table.column(k).null_count == 0 for k in required if k in table.column_names
        ):
            return SplitData(table)
    return decode_json_records(records, schema, required, source, partition)


def _parse_all(records: Sequence[tuple[int, bytes]], schema: Mapping[str, str]) -> Any:
    """The values parsed as newline-delimited JSON with the schema's types, or None when a
    value is not one such object (bad JSON, another type, a value spanning lines)."""
    import io

    import pyarrow as pa
    import pyarrow.json as pj

    from runners.engine.sources import JSON_TYPES

    types = pa.schema([(k, JSON_TYPES[v]) for k, v in schema.items()])
    data = b"\n".join(value for _, value in records)
    try:
        table = pj.read_json(
            io.BytesIO(data),
            read_options=pj.ReadOptions(use_threads=False, block_size=max(1 << 20, len(data) + 1)),
            parse_options=pj.ParseOptions(
                explicit_schema=types, unexpected_field_behavior="ignore"
            ),
        )
    except (pa.ArrowException, ValueError):
        return None
    if table.num_rows != len(records) or table.schema != types:
        return None  # an empty value, or several objects in one value
    return table.combine_chunks()


__all__ = ["KafkaSource", "decode_values", "parse_partition", "partition_name"]
