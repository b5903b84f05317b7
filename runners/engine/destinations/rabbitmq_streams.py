"""An exactly-once RabbitMQ Streams sink: publisher deduplication with ids derived from the epoch.

Every row of an epoch is published to `stream` as an AMQP 1.0 message (the row as a JSON body,
application properties ``epochal-epoch`` and ``epochal-snapshot``) by the *named producer*
``epochal.<namespace>/<branch>.<sink name>``. The messages go in *sub-entries* of at most
`batch_size` messages (rabbitmq_entries.py), each stored whole or not at all under the
publishing id of its last row, ``(generation + epoch) * 10**12 + index`` (log_records.py). The
broker keeps the last publishing id of a named producer in the stream and drops an entry whose
id is not above it, so a repeated commit cannot publish a message twice.

- **prepare** (before the snapshot's CAS) encodes the epoch's rows and fixes the generation
  from the producer's last publishing id; nothing is published.
- **commit** (after the CAS) asks the broker for the producer's last publishing id and
  publishes the rows after it, waiting for the broker's confirms. A run killed inside the
  commit left a prefix of the epoch in the stream; repeating it publishes the rest.
- **committed** asks for the last publishing id too and reads the properties of the stream's
  last message: the epoch and snapshot the stream holds.

The connections to the broker stay open across epochs (rabbitmq_session.py), until `close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import weakref
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from runners.engine.crash import maybe_crash
from runners.engine.destinations.fields import check_password_env, check_positive, with_password
from runners.engine.destinations.log_records import (
    LogSink,
    encoded_rows,
    identity,
    position,
    stage,
)
from runners.engine.destinations.rabbitmq_entries import MAX_MESSAGES, sub_entries
from runners.engine.destinations.rabbitmq_session import BrokerSession
from runners.engine.rabbitmq_stream import DATA_SECTION, Endpoint
from runners.engine.sinks import EpochOutput, Held

KIND = "rabbitmq_streams"
EPOCH_PROPERTY = "epochal-epoch"
SNAPSHOT_PROPERTY = "epochal-snapshot"
TIMEOUT_S = 60.0
#: the most bytes of messages per sub-entry, so per publish frame (the broker's frame_max is
#: 1 MiB by default)
FRAME_BYTES = 512 * 1024
log = logging.getLogger(__name__)
T = TypeVar("T")
#: guards the creation of a sink's session
_SESSIONS = threading.Lock()


class RabbitMQSinkError(RuntimeError):
    """The broker refused or did not confirm the sink's messages."""


@dataclass
class RabbitMQStreamsSink(LogSink):
    """Writes each epoch's output rows to the RabbitMQ stream `stream` at `url`
    (``rabbitmq-stream://user:password@host:5552/vhost``) exactly once. The stream must exist
    (its retention is the admin's choice). `load_balancer`: the broker is reached through a
    load balancer or proxy at the URL's address (connections never go to the address the
    broker advertises)."""

    KIND: ClassVar[str] = KIND
    REQUIRED: ClassVar[dict[str, type]] = {"url": str, "stream": str}
    OPTIONAL: ClassVar[dict[str, type]] = {
        "batch_size": int, "load_balancer": bool, "password_env": str,
    }  # fmt: skip

    url: str
    stream: str
    batch_size: int = 5_000
    load_balancer: bool = False
    #: the environment variable holding the password (never in `url`)
    password_env: str = ""
    name: str = KIND
    _prepared: dict[tuple[str, str, int], list[bytes]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _broker: BrokerSession | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            Endpoint.parse(self.url)
        except ValueError as exc:
            raise ValueError(f"sink {self.name!r} ({KIND}): field 'url': {exc}") from None
        if not self.stream or len(self.stream) > 255:
            raise ValueError(
                f"sink {self.name!r} ({KIND}): field 'stream' must name a stream (1 to 255 "
                f"characters), not {self.stream!r}"
            )
        check_positive(KIND, self.name, "batch_size", self.batch_size, MAX_MESSAGES)
        check_password_env(KIND, self.name, self.password_env)

    def _connect_url(self) -> str:
        return with_password(self.url, self.password_env, KIND, self.name)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_prepared", "_broker")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _prepared={}, _broker=None)

    def producer_name(self, writer: str) -> str:
        """The named producer (deduplication reference) of the branch identity `writer`."""
        return f"epochal.{writer}.{self.name}"

    def _describe(self) -> str:
        return f"sink {self.name!r}: RabbitMQ stream {self.stream!r}"

    def _consumer(self) -> Any:
        from rstream import Consumer

        e = Endpoint.parse(self._connect_url())
        return Consumer(
            e.host, e.port, username=e.username, password=e.password, vhost=e.vhost,
            connection_name="epochal-sink", load_balancer_mode=self.load_balancer,
        )  # fmt: skip

    def _run(self, work: Any, timeout: float | None = TIMEOUT_S) -> Any:
        """Run a consumer's coroutine on a loop of its own (reading the stream back)."""
        try:
            return asyncio.run(asyncio.wait_for(work, timeout))
        except (RabbitMQSinkError, ValueError):
            raise
        except Exception as exc:
            raise RabbitMQSinkError(f"{self._describe()} at {self.url}: {exc!r}") from None

    def _session(self) -> BrokerSession:
        with _SESSIONS:  # prepare (the job's thread) and commit (the catch-up driver's) may race
            if self._broker is None:
                self._broker = BrokerSession(self._connect_url(), self.stream, name=self.name,
                                             load_balancer=self.load_balancer)  # fmt: skip
                weakref.finalize(self, self._broker.close)
            return self._broker

    def _call(self, work: Callable[[BrokerSession], Coroutine[Any, Any, T]]) -> T:
        """Run `work` on the sink's connections to the broker (rabbitmq_session.py)."""
        session = self._session()
        try:
            return session.run(work(session), TIMEOUT_S)
        except (RabbitMQSinkError, ValueError):
            raise
        except Exception as exc:
            raise RabbitMQSinkError(f"{self._describe()} at {self.url}: {exc!r}") from None

    # -- broker round trips ------------------------------------------------------------------

    def top(self, writer: str) -> int:
        """The last publishing id of `writer`'s producer (0: none)."""
        reference = self.producer_name(writer)

        async def ask(session: BrokerSession) -> int:
            if not await session.stream_exists():
                raise ValueError(
                    f"{self._describe()} does not exist at {self.url}: create it first "
                    "(rabbitmq_stream.create_stream, or rabbitmq-streams add_stream)"
                )
            return await session.top(reference)

        return self._call(ask)

    def check(self) -> None:
        """ValueError unless the broker answers and the stream exists: before a job starts."""
        try:
            self.top("check/check")
        except RabbitMQSinkError as exc:
            raise ValueError(f"{exc} (field 'url': the broker is unreachable)") from None

    def _publish(self, writer: str, first: int, rows: Sequence[bytes], epoch: int,
                 snapshot: str, crash: tuple[str, int] | None) -> None:  # fmt: skip
        """Publish the rows after the producer's last publishing id, in sub-entries of at most
        `batch_size` messages, each under the publishing id of its last row; the first
        sub-entry is confirmed before the rest go (a crash test kills the run between)."""
        reference = self.producer_name(writer)
        top = self.top(writer)
        start = max(0, top - first + 1) if top >= first else 0
        if start >= len(rows):
            return
        head = properties_section({EPOCH_PROPERTY: str(epoch), SNAPSHOT_PROPERTY: snapshot})
        entries = sub_entries(rows[start:], head, max_messages=self.batch_size,
                              max_bytes=FRAME_BYTES)  # fmt: skip
        ids = [(first + start + e.last, e) for e in entries]
        try:
            self._call(lambda s: s.publish(reference, ids[:1]))
            maybe_crash(crash, "mid_sink_commit", epoch)
            if len(ids) > 1:
                self._call(lambda s: s.publish(reference, ids[1:]))
        except RabbitMQSinkError as exc:
            raise RabbitMQSinkError(f"{exc} (epoch {epoch})") from None

    async def _tail(self) -> tuple[int, bytes] | None:
        """(offset, message) of the stream's last message (None: no message). The broker
        delivers the last chunk at once, so its last message is there when the first is."""
        from rstream import ConsumerOffsetSpecification, OffsetType

        consumer = self._consumer()
        seen: dict[int, bytes] = {}
        got = asyncio.Event()

        def on_message(message: Any, context: Any) -> None:
            seen[context.offset] = bytes(message)
            got.set()

        try:
            await consumer.start()
            await consumer.subscribe(
                self.stream, on_message, initial_credit=1,
                offset_specification=ConsumerOffsetSpecification(OffsetType.LAST, None),
            )  # fmt: skip
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(got.wait(), 5.0)
        finally:
            with contextlib.suppress(Exception):
                await consumer.close()
        return (max(seen), seen[max(seen)]) if seen else None

    async def _last(self) -> tuple[int, str] | None:
        """(epoch, snapshot) from the properties of the stream's last message."""
        tail = await self._tail()
        if tail is None:
            return None
        props = _text_keys(amqp_decoder(tail[1]).application_properties)
        epoch, snapshot = props.get(EPOCH_PROPERTY), props.get(SNAPSHOT_PROPERTY)
        if epoch is None or snapshot is None:
            return None
        text = [v.decode() if isinstance(v, bytes) else str(v) for v in (epoch, snapshot)]
        return int(text[0]), text[1]

    # -- the Sink protocol -------------------------------------------------------------------

    def prepare(self, output: EpochOutput) -> dict[str, Any]:
        try:
            top = self.top(identity(output.namespace, output.branch))
        except RabbitMQSinkError as exc:  # down: the commit finds it when it is back
            log.warning("%s unreachable at prepare (%s)", self._describe(), exc)
            top = 0
        rows, record = stage(output, self.name, self.stream, top)
        self._prepared[(output.namespace, output.branch, output.epoch)] = rows
        return record

    def commit(self, output: EpochOutput, pending: Mapping[str, Any]) -> None:
        if output.snapshot_id is None:
            raise ValueError("commit needs the snapshot that committed the epoch")
        rows = self._prepared.pop((output.namespace, output.branch, output.epoch), None)
        writer = str(pending["identity"])
        first = position(int(pending["generation"]), output.epoch, 0)
        count = int(pending.get("records", -1))
        if rows is None:  # prepared by a process that is gone
            if count >= 0 and self.top(writer) >= first + count - 1:
                return  # every message is there (or the epoch has none)
            rows = encoded_rows(output)
        self._publish(writer, first, rows, output.epoch, output.snapshot_id, output.crash)

    def committed(self, pending: Mapping[str, Any]) -> Held | None:
        """The epoch of the stream's last message, if the stream holds all of it: a commit
        killed midway left a prefix of `pending`'s epoch, which counts as the epoch before
        (its snapshot unknown here: "")."""
        top = self.top(str(pending["identity"]))
        if top == 0:
            return None
        last = self._run(self._last())
        if last is None:
            return None
        epoch, count = int(pending["epoch"]), int(pending.get("records", 0))
        whole = position(int(pending["generation"]), epoch, count - 1)
        if last[0] == epoch and top < whole:
            return Held(epoch - 1, "") if epoch > 1 else None
        return Held(*last)

    def published(self) -> dict[int, list[dict[str, Any]]]:
        """The stream's rows per epoch (property ``epochal-epoch``), every message of it up
        to its last one when this is called."""
        epochs: dict[int, list[dict[str, Any]]] = {}
        for _, raw in sorted(self._run(self._read_all(), timeout=None).items()):
            message = amqp_decoder(raw)
            props = _text_keys(message.application_properties)
            body = message.body
            if isinstance(body, list):
                body = b"".join(bytes(b) for b in body)
            epoch = props[EPOCH_PROPERTY]
            epoch = epoch.decode() if isinstance(epoch, bytes) else epoch
            epochs.setdefault(int(epoch), []).append(json.loads(bytes(body)))
        return epochs

    async def _read_all(self) -> dict[int, bytes]:
        """Every message from the first offset to the last one (a minute without one: an
        error)."""
        from rstream import ConsumerOffsetSpecification, OffsetType

        tail = await self._tail()
        if tail is None:
            return {}
        got: dict[int, bytes] = {}
        done = asyncio.Event()

        def on_message(message: Any, context: Any) -> None:
            got[context.offset] = bytes(message)
            if context.offset >= tail[0]:
                done.set()

        consumer = self._consumer()
        try:
            await consumer.start()
            spec = ConsumerOffsetSpecification(OffsetType.FIRST, None)
            await consumer.subscribe(self.stream, on_message, offset_specification=spec)
            await asyncio.wait_for(done.wait(), TIMEOUT_S)
        finally:
            with contextlib.suppress(Exception):
                await consumer.close()
        return {offset: raw for offset, raw in got.items() if offset <= tail[0]}

    def close(self) -> None:
        self._prepared.clear()
        broker, self._broker = self._broker, None
        if broker is not None:
            broker.close()


def properties_section(properties: Mapping[str, str]) -> bytes:
    """The AMQP 1.0 application-properties section of `properties`, encoded once per epoch
    (rstream's encoder costs tens of microseconds a message)."""
    from rstream import AMQPMessage

    encoded = bytes(AMQPMessage(body=b"-", application_properties=dict(properties)))
    return encoded[: encoded.rindex(DATA_SECTION)]


def _text_keys(properties: Mapping[Any, Any] | None) -> dict[str, Any]:
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in (properties or {}).items()}


def amqp_decoder(raw: bytes) -> Any:
    from rstream import amqp_decoder as decode

    return decode(raw)


__all__ = ["RabbitMQStreamsSink"]
