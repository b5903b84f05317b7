"""The RabbitMQ Streams sink's connections to the broker, kept open across epochs.

Opening an `rstream` client costs little, but closing one sleeps 0.2 s in the client, and the
sink used to open and close two or three per epoch (prepare's question for the producer's last
publishing id, commit's publisher): most of its time per epoch. A `BrokerSession` keeps them
open for the sink's life on an event loop of its own thread (so the client's heartbeats are
answered between epochs too): a *locator* connection that answers the questions (does the
stream exist, the producer's last publishing id) and, per named producer, a publisher on the
stream leader's connection. Callers in any thread run a coroutine on it with `run`.

Publishing is the stream protocol's sub-entry publish (rabbitmq_entries.py) with the sink's
own publishing ids, one frame per sub-entry; the confirms (or errors) are matched to the ids
here. Anything that fails (a refused publish, a lost connection, a timeout) closes every
connection: the next call opens new ones, so a broker back after an outage is found again.
The client's own reconnection is off for the same reason: the sink retries, not the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from runners.engine.destinations.rabbitmq_entries import SubEntry
from runners.engine.rabbitmq_stream import Endpoint

T = TypeVar("T")
#: ``PublishSubBatching``, uncompressed: bit 7 set (a sub-entry), compression 0
SUB_ENTRY = 0x80
#: bytes of a publish frame around one sub-entry's data
FRAME_OVERHEAD = 32


class BrokerUnavailableError(ConnectionError):
    """The connection to the broker was lost, or the broker refused a publish."""


class BrokerSession:
    """Connections to the broker at `url` for one sink writing `stream` (see the module
    docstring). `load_balancer`: connect only to the URL's address."""

    def __init__(self, url: str, stream: str, *, load_balancer: bool, name: str) -> None:
        self.endpoint, self.stream = Endpoint.parse(url), stream
        self.load_balancer, self.name = load_balancer, name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._locator: Any = None
        self._producers: dict[str, Any] = {}  # reference -> rstream Producer
        self._publishers: dict[str, Any] = {}  # reference -> rstream _Publisher
        self._waiting: dict[int, asyncio.Future[None]] = {}

    # -- the loop ------------------------------------------------------------------------------

    def run(self, work: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run `work` on the session's loop and wait for it (at most `timeout` seconds);
        any failure but a ValueError closes the connections before it is raised."""
        loop = self._started()
        future = asyncio.run_coroutine_threadsafe(self._guarded(work, timeout), loop)
        return future.result(timeout + 30)

    async def _guarded(self, work: Coroutine[Any, Any, T], timeout: float) -> T:
        try:
            return await asyncio.wait_for(work, timeout)
        except ValueError:
            raise
        except BaseException:
            await self._disconnect()
            raise

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._start_lock:
            if self._loop is None or self._thread is None or not self._thread.is_alive():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, daemon=True,
                                          name=f"epochal-rabbitmq-{self.name}")  # fmt: skip
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def close(self) -> None:
        """Close the connections and stop the loop's thread."""
        with self._start_lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        if thread is threading.current_thread():  # dropped by a coroutine of its own loop
            loop.create_task(self._disconnect()).add_done_callback(lambda _: loop.stop())
            return
        if thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._disconnect(), loop).result(15)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(15)
        if not thread.is_alive():
            loop.close()

    # -- connections ---------------------------------------------------------------------------

    def _producer(self) -> Any:
        from rstream import Producer
        from rstream.recovery import BackOffRecoveryStrategy

        e = self.endpoint
        return Producer(
            e.host, e.port, username=e.username, password=e.password, vhost=e.vhost,
            connection_name="epochal-sink", load_balancer_mode=self.load_balancer,
            max_retries=3, on_close_handler=self._on_close,
            recovery_strategy=BackOffRecoveryStrategy(enable=False),
        )  # fmt: skip

    async def _locator_client(self) -> Any:
        if self._locator is None:
            self._locator = self._producer()
        client = await self._locator.default_client
        if not client.is_connection_alive():
            raise BrokerUnavailableError("the connection to the broker was closed")
        return client

    async def _publisher(self, reference: str) -> Any:
        from rstream import schema

        publisher = self._publishers.get(reference)
        if publisher is not None and publisher.client.is_connection_alive():
            return publisher
        producer = self._producers.get(reference)
        if producer is None:
            producer = self._producers[reference] = self._producer()
        publisher = await producer._get_or_create_publisher(self.stream, publisher_name=reference)
        handler = f"epochal-{reference}"
        publisher.client.add_handler(schema.PublishConfirm, self._on_confirm, name=handler)
        publisher.client.add_handler(schema.PublishError, self._on_error, name=handler + "-error")
        self._publishers[reference] = publisher
        return publisher

    async def _disconnect(self) -> None:
        self._fail_waiting("the connection to the broker was closed")
        producers = [*self._producers.values(), self._locator]
        self._producers, self._publishers, self._locator = {}, {}, None
        for producer in producers:
            if producer is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(producer.close(), 10)

    # -- confirms ------------------------------------------------------------------------------

    async def _on_confirm(self, frame: Any) -> None:
        for publishing_id in frame.publishing_ids:
            waiter = self._waiting.pop(publishing_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    async def _on_error(self, frame: Any) -> None:
        for error in frame.errors:
            waiter = self._waiting.pop(error.publishing_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_exception(BrokerUnavailableError(
                    f"the broker refused publishing id {error.publishing_id} "
                    f"(code {error.response_code})"
                ))  # fmt: skip

    async def _on_close(self, info: Any) -> None:
        self._fail_waiting(f"the connection to the broker was closed ({info.reason})")

    def _fail_waiting(self, reason: str) -> None:
        waiting, self._waiting = self._waiting, {}
        for waiter in waiting.values():
            if not waiter.done():
                waiter.set_exception(BrokerUnavailableError(reason))

    # -- what the sink asks --------------------------------------------------------------------

    async def stream_exists(self) -> bool:
        return bool(await (await self._locator_client()).stream_exists(self.stream))

    async def top(self, reference: str) -> int:
        """The last publishing id of the named producer `reference` (0: none)."""
        client = await self._locator_client()
        return int(await client.query_publisher_sequence(self.stream, reference))

    async def publish(self, reference: str, entries: Sequence[tuple[int, SubEntry]]) -> None:
        """Publish each (publishing id, sub-entry) as the named producer `reference`, one frame
        each, and wait until the broker confirmed them all."""
        from rstream import schema

        publisher = await self._publisher(reference)
        client = publisher.client
        loop = asyncio.get_running_loop()
        waiters = []
        for publishing_id, entry in entries:
            if len(entry.data) + FRAME_OVERHEAD > client.frame_max:
                raise ValueError(
                    f"a sub-entry of {len(entry.data)} bytes exceeds the broker's frame_max "
                    f"({client.frame_max}): raise the broker's stream frame_max"
                )
            waiter = self._waiting[publishing_id] = loop.create_future()
            waiters.append(waiter)
            await client.send_frame(schema.PublishSubBatching(
                publisher_id=publisher.id, number_of_root_messages=1,
                publishing_id=publishing_id, compress_type=SUB_ENTRY,
                subbatching_message_count=entry.count, uncompressed_data_size=len(entry.data),
                compressed_data_size=len(entry.data), messages=entry.data,
            ))  # fmt: skip
            if not client.is_connection_alive():
                raise BrokerUnavailableError("the connection to the broker was closed")
        await asyncio.gather(*waiters)


__all__ = ["BrokerSession", "BrokerUnavailableError"]
