"""An exactly-once Kafka sink through Kafka transactions (the second phase of the epoch commit).

Each part of an epoch's output (one task's key-group range) is written by a transactional
producer whose ``transactional.id`` is derived from the job's namespace, the branch, the
sink's name, the key-group range and the epoch (`transactional_id`):

- **prepare** (during the epoch, on the driver once the epoch's tasks wrote their output):
  the part's rows are read back from the store and produced inside a transaction that is
  flushed but left open — in the log, invisible to ``read_committed`` consumers. The
  producers for the epoch's ids are created (``init_transactions``) in the background while
  the epoch's tasks run. The pending record lists the transactions.
- **commit** (after the snapshot's compare-and-swap): each transaction also commits the
  *marker* — the offset ``epoch`` with metadata ``{"epoch", "snapshot"}`` of a consumer group
  named after the part (`marker_group`) — and is committed. Records and marker become visible
  together, so the marker says exactly which epoch of this branch the topic holds.
- **a restart** finds the pending record in the branch head. A Kafka transaction can only be
  ended by the producer that opened it (librdkafka cannot resume one in another process), so
  for every part whose marker does not name the head snapshot it initialises the same
  ``transactional.id`` — which aborts the dead process's open transaction — produces the
  part's rows again from the snapshot and commits them with the marker. Parts whose marker
  names the head are left alone. ``read_committed`` consumers see every epoch once.

An epoch abandoned before its CAS leaves open transactions; the next attempt of the same epoch
with the same key-group ranges initialises the same ids and aborts them, otherwise the broker
aborts them after ``transaction_timeout_ms`` (until then ``read_committed`` consumers of the
topic wait at them, they never see their records).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa

from runners.engine.crash import maybe_crash
from runners.engine.kafka_client import (
    KafkaError,
    ask,
    check_bootstrap,
    check_config,
    settings,
    topic_partitions,
)
from runners.engine.sinks import EpochOutput, Held, OutputPart

TIMEOUT_S = 60.0
EPOCH_HEADER = "epochal-epoch"


@dataclass
class KafkaSink:
    """Writes each epoch's output rows to `topic` at `bootstrap_servers` exactly once.

    A record's value is the output row as a JSON object, its key the key column's value (a
    JSON array for a key of several columns), its header ``epochal-epoch`` the epoch; records
    are partitioned by key (``murmur2_random``, as Java clients do). `config`: further
    librdkafka settings (security, SASL, TLS, compression). `id_prefix` starts every
    transactional id and marker group.
    """

    bootstrap_servers: str
    topic: str
    config: Mapping[str, Any] = field(default_factory=dict)
    transaction_timeout_ms: int = 60_000
    id_prefix: str = "epochal"
    name: str = "kafka"
    _runtime: _Runtime | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.bootstrap_servers = check_bootstrap(self.bootstrap_servers)
        if (
            not isinstance(self.topic, str)
            or not self.topic.replace(".", "").replace("_", "").replace("-", "").isalnum()
        ):
            raise ValueError(f"topic {self.topic!r}: Kafka topic names are [A-Za-z0-9._-]")
        self.config = check_config(self.config)
        if not isinstance(self.transaction_timeout_ms, int) or self.transaction_timeout_ms < 1000:
            raise ValueError(
                f"transaction_timeout_ms must be an integer of at least 1000, "
                f"not {self.transaction_timeout_ms!r}"
            )

    def __getstate__(self) -> dict[str, Any]:
        # the job (and this sink with it) travels to Spark tasks; producers stay here
        return {k: v for k, v in self.__dict__.items() if k != "_runtime"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._runtime = None

    @property
    def runtime(self) -> _Runtime:
        if self._runtime is None:
            self._runtime = _Runtime()
        return self._runtime

    # -- names -------------------------------------------------------------------------------

    def marker_group(self, namespace: str, branch: str, first: int, last: int) -> str:
        """The consumer group whose offset on (topic, 0) marks the part's last epoch."""
        return f"{self.id_prefix}.{namespace}.{branch}.{self.name}.kg{first}-{last}"

    def transactional_id(self, namespace: str, branch: str, first: int, last: int,
                         epoch: int) -> str:  # fmt: skip
        return f"{self.marker_group(namespace, branch, first, last)}.e{epoch}"

    def _ids(self, output: EpochOutput, part: OutputPart) -> tuple[str, str]:
        args = (output.namespace, output.branch, part.first_key_group, part.last_key_group)
        return self.transactional_id(*args, output.epoch), self.marker_group(*args)

    # -- producers ---------------------------------------------------------------------------

    def _new_producer(self, transactional_id: str) -> Any:
        from confluent_kafka import Producer

        producer = Producer(
            settings(
                self.bootstrap_servers, {"partitioner": "murmur2_random", **self.config},
                transactional_id=transactional_id,
                transaction_timeout_ms=self.transaction_timeout_ms,
                linger_ms=5, batch_size=1 << 20, queue_buffering_max_messages=1_000_000,
                queue_buffering_max_kbytes=1 << 20,
            )
        )  # fmt: skip
        try:
            producer.init_transactions(TIMEOUT_S)  # fences and aborts an earlier attempt
        except Exception as exc:
            raise KafkaError(
                f"Kafka sink {self.name!r}: cannot start transactions as {transactional_id} at "
                f"{self.bootstrap_servers}: {exc}"
            ) from None
        return producer

    def start_epoch(self, namespace: str, branch: str, epoch: int,
                    ranges: list[tuple[int, int]]) -> None:  # fmt: skip
        """Capability `sinks.StartsEpochs`, before the epoch's tasks: create the producers in
        the background (``init_transactions`` costs a round trip to the coordinator each)."""
        runtime = self.runtime
        for first, last in ranges:
            tid = self.transactional_id(namespace, branch, first, last, epoch)
            if tid not in runtime.warming and tid not in runtime.open:
                runtime.warming[tid] = runtime.pool.submit(self._new_producer, tid)

    def _producer(self, transactional_id: str) -> Any:
        future = self.runtime.warming.pop(transactional_id, None)
        return future.result() if future is not None else self._new_producer(transactional_id)

    def _check_topic(self) -> None:
        if self.runtime.topic_checked:
            return
        if self.topic not in topic_partitions(self.bootstrap_servers, self.config):
            raise KafkaError(
                f"Kafka sink {self.name!r}: topic {self.topic!r} does not exist at "
                f"{self.bootstrap_servers}; create it first (kafka_client.create_topic, or "
                "kafka-topics.sh --create)"
            )
        self.runtime.topic_checked = True

    def _produce(self, producer: Any, output: EpochOutput, part: OutputPart) -> int:
        """Produce the part's rows into the producer's open transaction; the record count."""
        headers = [(EPOCH_HEADER, str(output.epoch).encode())]
        count = 0
        produce, topic = producer.produce, self.topic
        for table in output.tables(part):
            for key, row in zip(_keys(table, output.key), table.to_pylist(), strict=True):
                value = orjson.dumps(row, default=str)  # bytes, decimals: as text
                try:
                    produce(topic, value, key, headers=headers)
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.flush(TIMEOUT_S)
                    produce(topic, value, key, headers=headers)
                count += 1
        left = producer.flush(TIMEOUT_S)
        if left:
            raise KafkaError(
                f"Kafka sink {self.name!r}: {left} records of epoch {output.epoch} were not "
                f"delivered to {self.topic} within {TIMEOUT_S:.0f} s"
            )
        return count

    # -- the Sink protocol -------------------------------------------------------------------

    def prepare(self, output: EpochOutput) -> dict[str, Any]:
        self._check_topic()
        transactions = []
        for part in output.parts:
            tid, group = self._ids(output, part)
            producer = self._producer(tid)
            producer.begin_transaction()
            records = self._produce(producer, output, part)
            self.runtime.open[tid] = producer
            transactions.append({"id": tid, "group": group, "records": records})
        return {"topic": self.topic, "transactions": transactions}

    def commit(self, output: EpochOutput, pending: Mapping[str, Any]) -> None:
        if output.snapshot_id is None:
            raise ValueError("commit needs the snapshot that committed the epoch")
        marker = json.dumps({"epoch": output.epoch, "snapshot": output.snapshot_id})
        transactions = pending["transactions"]
        for index, (part, txn) in enumerate(zip(output.parts, transactions, strict=True)):
            tid, group = str(txn["id"]), str(txn["group"])
            producer = self.runtime.open.pop(tid, None)
            if producer is None:  # prepared by a process that is gone: repeat what is missing
                held = self._held(group)
                if held is not None and held.snapshot_id == output.snapshot_id:
                    continue
                self._check_topic()
                producer = self._producer(tid)
                producer.begin_transaction()
                self._produce(producer, output, part)
            self._commit(producer, tid, group, output.epoch, marker)
            if index == 0:
                maybe_crash(output.crash, "mid_sink_commit", output.epoch)

    def _commit(self, producer: Any, tid: str, group: str, epoch: int, marker: str) -> None:
        from confluent_kafka import TopicPartition

        try:
            position = TopicPartition(self.topic, 0, epoch, metadata=marker)
            producer.send_offsets_to_transaction(
                [position], self.runtime.group_metadata(self, group), TIMEOUT_S
            )
            producer.commit_transaction(TIMEOUT_S)
        except Exception as exc:
            raise KafkaError(
                f"Kafka sink {self.name!r}: committing transaction {tid} (epoch {epoch}) to "
                f"{self.topic} failed: {exc}; the snapshot is committed and a restart "
                "finishes the epoch's publication"
            ) from None

    def committed(self, pending: Mapping[str, Any]) -> Held | None:
        held = [self._held(str(txn["group"])) for txn in pending["transactions"]]
        if not held or any(h is None for h in held):
            return None
        return min((h for h in held if h is not None), key=lambda h: h.epoch)

    def _held(self, group: str) -> Held | None:
        """The epoch and snapshot the marker of `group` names (None: no marker yet)."""
        from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

        request = [ConsumerGroupTopicPartitions(group, [TopicPartition(self.topic, 0)])]
        answers = ask(
            self.bootstrap_servers, self.config,
            lambda client: client.list_consumer_group_offsets(request, require_stable=True),
            "read the sink marker of",
        )  # fmt: skip
        (answer,) = answers.values()
        for tp in answer.topic_partitions:
            if tp.offset >= 0 and tp.metadata:
                doc = json.loads(tp.metadata)
                return Held(int(doc["epoch"]), str(doc["snapshot"]))
        return None

    def close(self) -> None:
        """Abort open transactions and close this process's producers (a stopped job)."""
        runtime = self._runtime
        if runtime is None:
            return
        for future in runtime.warming.values():
            future.cancel()
        for producer in runtime.open.values():
            # the broker aborts it after the transaction timeout anyway
            with contextlib.suppress(Exception):
                producer.abort_transaction(TIMEOUT_S)
        runtime.open.clear()
        runtime.pool.shutdown(wait=False)
        self._runtime = None


class _Runtime:
    """A sink's producers and consumers in the driver process (never pickled)."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="epochal-kafka-sink")
        self.warming: dict[str, Future[Any]] = {}
        self.open: dict[str, Any] = {}
        self.groups: dict[str, Any] = {}
        self.topic_checked = False
        self.lock = threading.Lock()

    def group_metadata(self, sink: KafkaSink, group: str) -> Any:
        """The consumer group metadata a transaction needs to commit the marker of `group`
        (a consumer that never subscribes: the group has no members)."""
        from confluent_kafka import Consumer

        with self.lock:
            if group not in self.groups:
                self.groups[group] = Consumer(
                    settings(sink.bootstrap_servers, sink.config, group_id=group,
                             enable_auto_commit=False)
                )  # fmt: skip
            return self.groups[group].consumer_group_metadata()


def _keys(table: pa.Table, key: tuple[str, ...]) -> list[bytes | None]:
    """The record keys of the rows: the key column's text, or a JSON array of the columns."""
    if not key or any(k not in table.column_names for k in key):
        return [None] * table.num_rows
    if len(key) == 1:
        values = table.column(key[0]).to_pylist()
        return [
            None if v is None else (v if isinstance(v, str) else orjson.dumps(v).decode()).encode()
            for v in values
        ]
    columns = [table.column(k).to_pylist() for k in key]
    return [orjson.dumps(list(row)) for row in zip(*columns, strict=True)]


__all__ = ["EPOCH_HEADER", "KafkaSink"]
