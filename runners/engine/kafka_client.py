"""Kafka connections shared by the Kafka source and the Kafka sink (`confluent-kafka`,
librdkafka): client settings, a cached admin client, and the topic helpers examples, tests and
benchmarks use (create, delete, publish, read with ``read_committed``).

`bootstrap_servers` is Kafka's own ``host:port[,host:port…]`` list; `config` holds any further
librdkafka settings (``security.protocol``, ``sasl.*``, ``ssl.*``, …) and is passed to every
client as is. Nothing here uses consumer-group offsets for reading: where the job is lives in
its snapshots.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: settings the source and the sink set themselves; a `config` naming one is refused
RESERVED = frozenset(
    {"bootstrap.servers", "group.id", "enable.auto.commit", "isolation.level",
     "transactional.id", "auto.offset.reset", "enable.partition.eof"}
)  # fmt: skip
REQUEST_TIMEOUT_S = 30.0
_SERVER = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5}$")
_admins: dict[str, Any] = {}


def admin_types() -> Any:
    """`confluent_kafka.admin` (NewTopic, NewPartitions, OffsetSpec…), untyped: the package
    does not re-export these names in its stubs."""
    import importlib

    return importlib.import_module("confluent_kafka.admin")


class KafkaError(RuntimeError):
    """A Kafka request failed; the message names the request, the topic and the broker's
    reason. `retriable`: the broker says a retry may succeed (a leader that moved, a broker
    that restarted)."""

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable


def check_bootstrap(servers: str) -> str:
    """`servers` if it is a ``host:port[,host:port…]`` list, else ValueError saying so."""
    parts = [s.strip() for s in str(servers).split(",")]
    if not servers or not all(_SERVER.match(p) for p in parts):
        raise ValueError(
            f"bootstrap_servers {servers!r}: expected host:port[,host:port…] "
            "(e.g. 127.0.0.1:9092; KAFKA_BOOTSTRAP_SERVERS from `bin/services env`)"
        )
    return ",".join(parts)


def check_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Extra librdkafka settings, refusing those the source and sink manage themselves."""
    if not isinstance(config, Mapping):
        raise ValueError(f"config must be a mapping of librdkafka settings, not {config!r}")
    clash = sorted(set(config) & RESERVED)
    if clash:
        raise ValueError(
            f"config sets {clash}: Epochal sets these itself (offsets live in the snapshot, "
            "transactions are per epoch); remove them"
        )
    return dict(config)


def settings(servers: str, config: Mapping[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    """A client's settings: the bootstrap servers, `config`, then `more` (dots as ``_``)."""
    out: dict[str, Any] = {"bootstrap.servers": servers, **(config or {})}
    out.update({k.replace("_", "."): v for k, v in more.items()})
    return out


def _admin_key(servers: str, config: Mapping[str, Any] | None) -> str:
    return json.dumps([servers, dict(config or {})], sort_keys=True, default=str)


def admin(servers: str, config: Mapping[str, Any] | None = None) -> Any:
    """The process's admin client for these servers and settings (created once)."""
    from confluent_kafka.admin import AdminClient

    key = _admin_key(servers, config)
    if key not in _admins:
        _admins[key] = AdminClient(settings(servers, config))
    return _admins[key]


def forget(servers: str, config: Mapping[str, Any] | None = None) -> None:
    """Drop the process's admin client for these servers (a cluster that is gone for good)."""
    _admins.pop(_admin_key(servers, config), None)


def ask(
    servers: str,
    config: Mapping[str, Any] | None,
    call: Callable[[Any], Mapping[Any, Any]],
    what: str,
    timeout: float = REQUEST_TIMEOUT_S,
) -> dict[Any, Any]:
    """Send an admin request (`call(admin client)` returns its futures) and wait for it. A
    retriable error — a broker that restarted, a leader that moved — is retried with a new
    client (librdkafka's admin client keeps stale leader epochs) until `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return results(call(admin(servers, config)), what)
        except KafkaError as exc:
            if not exc.retriable or time.monotonic() > deadline:
                raise
            _admins.pop(_admin_key(servers, config), None)
            time.sleep(0.5)


def results(
    futures: Mapping[Any, Any], what: str, timeout: float = REQUEST_TIMEOUT_S
) -> dict[Any, Any]:
    """The results of an admin request's futures; KafkaError naming `what` on a failure."""
    out: dict[Any, Any] = {}
    for key, future in futures.items():
        try:
            out[key] = future.result(timeout=timeout)
        except Exception as exc:  # KafkaException, or a timeout of the future
            raise KafkaError(
                f"{what} {_name(key)}: {_reason(exc)}", retriable=_retriable(exc)
            ) from None
    return out


#: errors after which a new admin client succeeds: librdkafka's admin client keeps the leader
#: epochs it saw before a broker restarted and is refused with them until it is replaced
#: (no leaders found, not leader, leader not available, fenced / unknown leader epoch)
STALE_LEADER_CODES = frozenset({-156, 5, 6, 74, 75})


def _retriable(exc: BaseException) -> bool:
    error = exc.args[0] if getattr(exc, "args", ()) else None
    check, code = getattr(error, "retriable", None), getattr(error, "code", None)
    if callable(code) and code() in STALE_LEADER_CODES:
        return True
    return isinstance(exc, TimeoutError) or bool(check() if callable(check) else False)


def _name(key: Any) -> str:
    topic, partition = getattr(key, "topic", None), getattr(key, "partition", None)
    if topic is not None:
        return f"{topic}:{partition}" if isinstance(partition, int) and partition >= 0 else topic
    return str(key)


def _reason(exc: BaseException) -> str:
    args = getattr(exc, "args", ())
    error = args[0] if args else exc
    text = getattr(error, "str", None)
    return str(text() if callable(text) else error) or type(exc).__name__


def topic_partitions(servers: str, config: Mapping[str, Any] | None = None) -> dict[str, int]:
    """topic -> partition count of every topic the cluster lists (internal ones excluded)."""
    deadline = time.monotonic() + REQUEST_TIMEOUT_S
    while True:
        try:
            metadata = admin(servers, config).list_topics(timeout=REQUEST_TIMEOUT_S)
            break
        except Exception as exc:  # KafkaException: the cluster did not answer
            if time.monotonic() > deadline:
                raise KafkaError(f"list the topics at {servers}: {_reason(exc)}") from None
            _admins.pop(_admin_key(servers, config), None)
            time.sleep(0.5)
    return {
        name: len(meta.partitions)
        for name, meta in metadata.topics.items()
        if meta.error is None and not name.startswith("__")
    }


def create_topic(
    servers: str,
    topic: str,
    partitions: int = 1,
    config: Mapping[str, str] | None = None,
    *,
    client_config: Mapping[str, Any] | None = None,
) -> None:
    """Create a topic (replication factor 1 unless the broker's default says more); no error
    when it exists. `config` holds topic settings, e.g. ``{"retention.ms": "60000"}``."""
    new = admin_types().NewTopic(topic, num_partitions=partitions, config=dict(config or {}))
    futures = admin(servers, client_config).create_topics([new], operation_timeout=30)
    try:
        results(futures, "create topic")
    except KafkaError as exc:
        if "already exists" not in str(exc).lower():
            raise
    _wait_for_topic(servers, topic, partitions, client_config)


def _wait_for_topic(
    servers: str, topic: str, partitions: int, config: Mapping[str, Any] | None
) -> None:
    deadline = time.monotonic() + REQUEST_TIMEOUT_S
    while topic_partitions(servers, config).get(topic, 0) < partitions:
        if time.monotonic() > deadline:
            raise KafkaError(f"topic {topic} did not appear with {partitions} partitions")
        time.sleep(0.05)


def add_partitions(
    servers: str, topic: str, total: int, *, client_config: Mapping[str, Any] | None = None
) -> None:
    """Grow a topic to `total` partitions."""
    new = admin_types().NewPartitions(topic, total)
    futures = admin(servers, client_config).create_partitions([new])
    results(futures, "add partitions to")
    _wait_for_topic(servers, topic, total, client_config)


def delete_topics(
    servers: str, topics: Sequence[str], *, client_config: Mapping[str, Any] | None = None
) -> None:
    """Delete topics (no error for one that does not exist)."""
    if not topics:
        return
    futures = admin(servers, client_config).delete_topics(list(topics), operation_timeout=30)
    for topic, future in futures.items():
        try:
            future.result(timeout=REQUEST_TIMEOUT_S)
        except Exception as exc:
            if "unknown topic" not in _reason(exc).lower():
                raise KafkaError(f"delete topic {topic}: {_reason(exc)}") from None


def delete_records(
    servers: str, topic: str, partition: int, before: int, *,
    client_config: Mapping[str, Any] | None = None,
) -> None:  # fmt: skip
    """Delete the records of a partition before offset `before` (what retention does)."""
    from confluent_kafka import TopicPartition

    futures = admin(servers, client_config).delete_records(
        [TopicPartition(topic, partition, before)]
    )
    results(futures, "delete records of")


def publish(
    servers: str,
    topic: str,
    records: Iterable[Mapping[str, Any] | bytes | None],
    *,
    key_field: str | None = None,
    partition: int | None = None,
    client_config: Mapping[str, Any] | None = None,
) -> int:
    """Publish records (dicts as JSON, bytes verbatim, None as a tombstone) with an idempotent
    producer and wait until the broker has them all; the record key is the value of
    `key_field` when given. Returns the number published."""
    from confluent_kafka import Producer

    producer = Producer(settings(servers, client_config, enable_idempotence=True, linger_ms=5))
    failures: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    count = 0
    for record in records:
        value = (
            record if record is None or isinstance(record, bytes) else json.dumps(record).encode()
        )
        key = None
        if key_field is not None and isinstance(record, Mapping) and key_field in record:
            key = str(record[key_field]).encode()
        kwargs: dict[str, Any] = {} if partition is None else {"partition": partition}
        while True:
            try:
                producer.produce(topic, value, key, on_delivery=delivered, **kwargs)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.05)
        count += 1
    left = producer.flush(REQUEST_TIMEOUT_S)
    if failures or left:
        raise KafkaError(f"publish to {topic}: {failures[:3] or f'{left} records undelivered'}")
    return count


def _bytes(value: str | bytes | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


@dataclass(frozen=True)
class Record:
    """A record read back from a topic."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]


def read_topic(
    servers: str,
    topic: str,
    *,
    isolation_level: str = "read_committed",
    client_config: Mapping[str, Any] | None = None,
    timeout: float = REQUEST_TIMEOUT_S,
) -> list[Record]:
    """Every record of a topic up to its current end (the last stable offset with
    ``read_committed``: records of aborted or open transactions are not returned), in
    partition then offset order."""
    from confluent_kafka import Consumer, IsolationLevel, TopicPartition

    latest = admin_types().OffsetSpec.latest()

    level = IsolationLevel[isolation_level.upper()]
    count = topic_partitions(servers, client_config).get(topic, 0)
    ends_req = {TopicPartition(topic, p): latest for p in range(count)}
    ends = ask(
        servers, client_config,
        lambda client: client.list_offsets(ends_req, isolation_level=level),
        "list offsets of",
    )  # fmt: skip
    consumer = Consumer(
        settings(servers, client_config, group_id="epochal-reader", enable_auto_commit=False,
                 isolation_level=isolation_level, auto_offset_reset="earliest")
    )  # fmt: skip
    out: list[Record] = []
    try:
        for p in range(count):
            end = ends[TopicPartition(topic, p)].offset
            consumer.assign([TopicPartition(topic, p, 0)])
            deadline = time.monotonic() + timeout
            while consumer.position([TopicPartition(topic, p)])[0].offset < end:
                if time.monotonic() > deadline:
                    raise KafkaError(f"read {topic}:{p}: end offset {end} not reached")
                for m in consumer.consume(10_000, 0.2):
                    if m.error() is not None:
                        raise KafkaError(f"read {topic}:{p}: {m.error()}")
                    offset = int(m.offset() or 0)
                    if offset < end:
                        pairs: Any = m.headers() or []
                        headers = {str(k): _bytes(v) or b"" for k, v in pairs}
                        key, value = m.key(), m.value()
                        out.append(Record(topic, p, offset, _bytes(key), _bytes(value), headers))
    finally:
        consumer.close()
    return out


__all__ = [
    "KafkaError",
    "Record",
    "add_partitions",
    "admin",
    "admin_types",
    "ask",
    "check_bootstrap",
    "check_config",
    "create_topic",
    "delete_records",
    "delete_topics",
    "forget",
    "publish",
    "read_topic",
    "settings",
    "topic_partitions",
]
