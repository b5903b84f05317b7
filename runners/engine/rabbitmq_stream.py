"""RabbitMQ Streams as a source: partition = stream, offset = the stream offset after the last
message read (the stream protocol's own message offsets, through `rstream`).

Every read is an ``OFFSET`` subscription over a fixed range ``[start, end)`` planned on the
driver and recorded in the epoch's manifest, so a replay reads the same messages; the broker's
offset tracking (``store_offset``) is never used. The oldest offset the stream still has (a
``first`` subscription) tells whether retention deleted messages a snapshot has not read, the
newest (``last``) where the stream ends.

Each message body is one JSON object decoded with `schema` like a JSON-lines file (AMQP 1.0
messages as every stream client publishes them, or raw bodies with ``encoding="raw"``);
anything else becomes a dead letter. Several streams (e.g. the partitions of a super stream,
``<name>-0`` … ``<name>-<n-1>``) are several partitions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from runners.engine.sources import DeadLetter, Split, SplitData, decode_json_records
from runners.engine.streams import (
    SourceDataLostError,
    StartingPosition,
    check_bounds,
    share,
)

#: how long a probe waits for the first chunk of a stream before calling it empty
PROBE_TIMEOUT_S = 1.0
#: a `latest` start waits longer, since calling a stream empty there means reading it all
LATEST_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 120.0
#: AMQP 1.0: descriptor 0x53 0x75 = a data section (the body as bytes)
DATA_SECTION = b"\x00Su"


@dataclass(frozen=True)
class Endpoint:
    """Where the stream protocol listens: ``rabbitmq-stream://user:password@host:5552/vhost``."""

    host: str
    port: int
    username: str
    password: str
    vhost: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme != "rabbitmq-stream" or not parts.hostname:
            raise ValueError(
                f"url {url!r}: expected rabbitmq-stream://user:password@host:5552/vhost"
            )
        vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
        return cls(
            parts.hostname,
            parts.port or 5552,
            unquote(parts.username or "guest"),
            unquote(parts.password or "guest"),
            vhost,
        )

    def consumer(self) -> Any:
        from rstream import Consumer

        return Consumer(
            self.host, self.port, username=self.username, password=self.password,
            vhost=self.vhost, connection_name="epochal",
        )  # fmt: skip

    def producer(self) -> Any:
        from rstream import Producer

        return Producer(
            self.host, self.port, username=self.username, password=self.password,
            vhost=self.vhost, connection_name="epochal",
        )  # fmt: skip


async def _subscribe_until(
    consumer: Any,
    stream: str,
    spec: Any,
    on_message: Any,
    timeout: float,
) -> bool:
    """Subscribe with `spec`, feed `on_message(offset, timestamp, body) -> done?` until it says
    done; False when nothing (more) came within `timeout` seconds."""
    done = asyncio.Event()

    def callback(message: Any, context: Any) -> None:
        if on_message(context.offset, context.timestamp, message):
            done.set()

    subscriber = await consumer.subscribe(stream, callback, offset_specification=spec,
                                          initial_credit=10)  # fmt: skip
    try:
        await asyncio.wait_for(done.wait(), timeout)
        return True
    except TimeoutError:
        return False
    finally:
        del subscriber  # a consumer serves one subscription; closing it ends that


async def _edge(endpoint: Endpoint, stream: str, kind: str, value: int = 0, *,
                timeout: float = PROBE_TIMEOUT_S) -> int | None:  # fmt: skip
    """The first offset from `kind` (first, timestamp) or the last offset (last) of a
    stream; None when the stream has no such message."""
    from rstream import StreamDoesNotExist

    async with _consumer(endpoint) as consumer:
        try:
            return await _probe(consumer, stream, kind, value, timeout)
        except StreamDoesNotExist:
            return None


@contextlib.asynccontextmanager
async def _consumer(endpoint: Endpoint) -> AsyncIterator[Any]:
    consumer = endpoint.consumer()
    try:
        yield consumer
    finally:
        await _close(consumer)


async def _close(consumer: Any) -> None:
    """Close a consumer's connections at once: each close waits 0.2 s for its listener, and
    `Consumer.close` closes them one after the other (the broker ends their subscriptions)."""
    consumer.stop()
    pool = getattr(getattr(consumer, "_pool", None), "_clients", None)
    if not isinstance(pool, dict):  # another rstream layout: the slow, public way
        with contextlib.suppress(Exception):
            await consumer.close()
        return
    clients = [client for group in pool.values() for client in group]
    await asyncio.gather(*(client.close() for client in clients), return_exceptions=True)
    pool.clear()


async def _probe(consumer: Any, stream: str, kind: str, value: int, timeout: float) -> int | None:
    from rstream import ConsumerOffsetSpecification, OffsetType

    types = {"first": OffsetType.FIRST, "last": OffsetType.LAST,
             "timestamp": OffsetType.TIMESTAMP}  # fmt: skip
    spec = ConsumerOffsetSpecification(types[kind], value if kind == "timestamp" else None)
    seen: list[int] = []

    def on_message(offset: int, timestamp: int, _: Any) -> bool:
        if kind == "timestamp" and timestamp < value:
            return False  # the chunk holding `value` may start before it
        seen.append(offset)
        return True  # a whole chunk is delivered before the waiter runs

    got = await _subscribe_until(consumer, stream, spec, on_message, timeout)
    if kind == "last":
        return max(seen) if seen else None
    return seen[0] if got and seen else None


@dataclass
class RabbitMQStreamSource:
    """Messages of one or more RabbitMQ streams (`streams`, one partition each) at `url`
    (``rabbitmq-stream://user:password@host:5552/vhost``).

    `start` is where a stream the snapshot has not read yet begins (`StartingPosition`:
    earliest, latest, ``offset:<n>``, ``timestamp:<ms>`` — the first chunk the broker stored
    at or after it). One epoch reads at most `max_records_per_epoch` messages and
    `max_bytes_per_epoch` bytes of bodies (each of the n streams gets 1/n of each bound);
    `records_per_split` offsets make one split (task input).
    """

    url: str
    streams: Sequence[str]
    schema: Mapping[str, str]
    required: Sequence[str] = ()
    start: str = "earliest"
    encoding: str = "amqp"
    max_records_per_epoch: int | None = 100_000
    max_bytes_per_epoch: int | None = None
    records_per_split: int = 50_000
    name: str = "rabbitmq"
    _start: StartingPosition = field(init=False, repr=False, compare=False)
    #: stream -> offset after its last message, as seen by the latest plan (driver only)
    _tails: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.streams = list(self.streams)
        check_bounds(
            self.streams, self.max_records_per_epoch, self.max_bytes_per_epoch,
            self.records_per_split,
        )  # fmt: skip
        Endpoint.parse(self.url)
        if self.encoding not in ("amqp", "raw"):
            raise ValueError(f"encoding must be amqp or raw, not {self.encoding!r}")
        self._start = StartingPosition.parse(self.start)
        if self._start.kind == "offset" and not self._start.value.isdigit():
            raise ValueError(f"start {self.start!r}: offset:<n> needs a non-negative integer")

    def describe(self, stream: str) -> str:
        return f"RabbitMQ stream {stream!r}"

    def _body(self, message: Any) -> bytes:
        data = bytes(message)
        if self.encoding == "raw":
            return data
        # fast path: a message that is exactly one data section (what most clients send)
        if data[:3] == DATA_SECTION and len(data) > 4:
            if data[3] == 0xA0 and len(data) == 5 + data[4]:
                return data[5:]
            if data[3] == 0xB0 and len(data) == 8 + int.from_bytes(data[4:8], "big"):
                return data[8:]
        from rstream import amqp_decoder

        body = amqp_decoder(data).body
        if body is None:
            return b""
        if isinstance(body, list):
            body = b"".join(bytes(b) for b in body)
        return body if isinstance(body, bytes) else str(body).encode()

    # -- driver side -------------------------------------------------------------------------

    async def _resolve(self, endpoint: Endpoint, stream: str) -> int:
        kind, value = self._start.kind, self._start.value
        if kind == "offset":
            return int(value)
        if kind == "earliest":
            return await _edge(endpoint, stream, "first") or 0
        if kind == "timestamp":
            first = await _edge(endpoint, stream, "timestamp", int(value))
            if first is not None:
                return first
        last = await _edge(endpoint, stream, "last", timeout=LATEST_TIMEOUT_S)
        return 0 if last is None else last + 1

    def _lost(self, stream: str, position: int, first: int | None) -> str | None:
        if first is None or first <= position:
            return None
        return (
            f"{self.describe(stream)}: retention deleted offsets {position} to {first - 1} "
            f"({first - position} messages) that the snapshot had not read (it resumes at "
            f"offset {position}; the oldest offset left is {first})"
        )

    async def _exists(self, endpoint: Endpoint, stream: str) -> bool:
        async with _consumer(endpoint) as consumer:
            return bool(await consumer.stream_exists(stream))

    async def _plan_stream(
        self, stream: str, committed: Mapping[str, int], max_records: int | None,
        max_bytes: int | None,
    ) -> list[Split]:  # fmt: skip
        endpoint = self.endpoint()
        known = stream in committed
        if known:
            exists, first, last = await asyncio.gather(
                self._exists(endpoint, stream),
                _edge(endpoint, stream, "first"),
                _edge(endpoint, stream, "last"),
            )
        else:
            exists, position, last = await asyncio.gather(
                self._exists(endpoint, stream),
                self._resolve(endpoint, stream),
                _edge(endpoint, stream, "last"),
            )
        if not exists:
            if known and committed[stream] > 0:
                raise SourceDataLostError(
                    f"{self.describe(stream)} no longer exists but the snapshot resumes at "
                    f"offset {committed[stream]}; the job stops rather than skip what it had "
                    "not read"
                )
            return []
        if known:
            position = int(committed[stream])
            problem = self._lost(stream, position, first)
            if problem is not None:
                raise SourceDataLostError(problem + "; the job stops rather than skip them")
        end = position if last is None else max(position, last + 1)
        self._tails[stream] = end
        if max_records is not None:
            end = min(end, position + max_records)
        if max_bytes is not None and end > position:
            end = await self._byte_cut(stream, position, end, max_bytes)
        if end <= position:
            # commit where a new stream starts (so `latest` means the first plan's tail)
            return [] if known else [Split(self.name, stream, position, position)]
        step = self.records_per_split
        return [Split(self.name, stream, a, min(end, a + step)) for a in range(position, end, step)]

    async def _plan(self, committed: Mapping[str, int]) -> list[Split]:
        max_records = share(self.max_records_per_epoch, len(self.streams))
        max_bytes = share(self.max_bytes_per_epoch, len(self.streams))
        per_stream = await asyncio.gather(
            *(self._plan_stream(s, committed, max_records, max_bytes) for s in self.streams)
        )
        return [split for splits in per_stream for split in splits]

    async def _byte_cut(self, stream: str, start: int, end: int, max_bytes: int) -> int:
        """The end of the longest range from `start` whose bodies fit `max_bytes` (>= 1)."""
        total, cut = 0, start
        for offset, body in await self._messages(stream, start, end):
            if total and total + len(body) > max_bytes:
                break
            total, cut = total + len(body), offset + 1
        return max(cut, start + 1)

    def endpoint(self) -> Endpoint:
        return Endpoint.parse(self.url)

    def plan(self, committed: Mapping[str, int]) -> list[Split]:
        return asyncio.run(self._plan(committed))

    # -- task side ---------------------------------------------------------------------------

    async def _messages(self, stream: str, start: int, end: int) -> list[tuple[int, bytes]]:
        """The messages at offsets ``[start, end)`` (the range was seen to exist)."""
        from rstream import ConsumerOffsetSpecification, OffsetType

        got: list[tuple[int, bytes]] = []

        def on_message(offset: int, _: int, message: Any) -> bool:
            if start <= offset < end:
                got.append((offset, message))
            return offset >= end - 1

        spec = ConsumerOffsetSpecification(OffsetType.OFFSET, start)
        async with _consumer(self.endpoint()) as consumer:
            complete = await _subscribe_until(consumer, stream, spec, on_message, READ_TIMEOUT_S)
        if not complete:  # a slow or unreachable broker: the epoch fails, a restart replans it
            raise TimeoutError(
                f"{self.describe(stream)}: offsets {start} to {end - 1} were planned but the "
                f"stream delivered only {len(got)} of them within {READ_TIMEOUT_S:.0f} s"
            )
        if got and got[0][0] > start:
            raise SourceDataLostError(
                self._lost(stream, start, got[0][0]) or f"{stream}: offset {start} is gone"
            )
        return got

    def read(self, split: Split, required: Sequence[str] = ()) -> SplitData:
        if split.end <= split.start:
            messages: list[tuple[int, bytes]] = []
        else:
            messages = asyncio.run(self._messages(split.partition, split.start, split.end))
        records: list[tuple[int, bytes]] = []
        broken: list[DeadLetter] = []
        for offset, message in messages:
            try:
                records.append((offset, self._body(message)))
            except Exception as exc:  # not an AMQP 1.0 message
                raw = bytes(message).decode("utf-8", "replace")
                reason = f"not an AMQP 1.0 message ({exc})"
                broken.append(DeadLetter(split.source, split.partition, offset, reason, raw))
        data = decode_json_records(
            records, self.schema, (*self.required, *required), split.source, split.partition
        )
        data.dead_letters.extend(broken)
        return data

    def backlog_records(self, offsets: Mapping[str, int]) -> int | None:
        """Messages after `offsets` as of the latest plan (no extra round trip to the broker
        before a commit); None before the first plan."""
        if not self._tails:
            return None
        return sum(max(0, tail - int(offsets.get(s, 0))) for s, tail in self._tails.items())

    def backlog(self, offsets: Mapping[str, int]) -> int | None:
        """Epochs of input waiting after `offsets` (per `max_records_per_epoch`)."""
        waiting = self.backlog_records(offsets)
        if waiting is None:
            return None
        bound = self.max_records_per_epoch
        return -(-waiting // bound) if bound else int(waiting > 0)

    def retained(self, offsets: Mapping[str, int]) -> str | None:
        async def check() -> str | None:
            endpoint = self.endpoint()
            for stream, position in sorted(offsets.items()):
                if not await self._exists(endpoint, stream):
                    if position > 0:
                        return f"{self.describe(stream)} no longer exists"
                    continue
                problem = self._lost(stream, position, await _edge(endpoint, stream, "first"))
                if problem is not None:
                    return problem
            return None

        return asyncio.run(check())


async def _publish(endpoint: Endpoint, stream: str, bodies: Sequence[bytes], amqp: bool) -> None:
    from rstream import AMQPMessage

    confirmed = 0
    done = asyncio.Event()

    def on_confirm(status: Any) -> None:
        nonlocal confirmed
        confirmed += 1
        if confirmed >= len(bodies):
            done.set()

    producer = endpoint.producer()
    try:
        for i in range(0, len(bodies), 500):
            batch = [AMQPMessage(body=b) if amqp else b for b in bodies[i : i + 500]]
            await producer.send_batch(stream, batch, on_publish_confirm=on_confirm)
        if bodies:
            await asyncio.wait_for(done.wait(), 60)
    finally:
        await producer.close()


def publish(url: str, stream: str, records: Sequence[Mapping[str, Any] | bytes], *,
            amqp: bool = True) -> None:  # fmt: skip
    """Publish records (dicts as JSON, bytes verbatim) to a stream and wait for the broker's
    confirms (for examples, tests and benchmarks)."""
    bodies = [r if isinstance(r, bytes) else json.dumps(r).encode() for r in records]
    asyncio.run(_publish(Endpoint.parse(url), stream, bodies, amqp))


def create_stream(url: str, stream: str, **arguments: Any) -> None:
    """Declare a stream (no error when it exists); `arguments` as the stream protocol names
    them, e.g. ``max_length_bytes=…`` for ``max-length-bytes``."""

    async def create() -> None:
        producer = Endpoint.parse(url).producer()
        try:
            args = {k.replace("_", "-"): v for k, v in arguments.items()}
            await producer.create_stream(stream, arguments=args, exists_ok=True)
        finally:
            await producer.close()

    asyncio.run(create())


def delete_stream(url: str, stream: str) -> None:
    """Delete a stream (no error when it does not exist)."""

    async def delete() -> None:
        producer = Endpoint.parse(url).producer()
        try:
            await producer.delete_stream(stream, missing_ok=True)
        finally:
            await producer.close()

    asyncio.run(delete())


__all__ = ["Endpoint", "RabbitMQStreamSource", "create_stream", "delete_stream", "publish"]
