"""How the RabbitMQ Streams sink publishes: an epoch's rows as sub-entries built by one Arrow
kernel call each (read back with the client's own parser), on connections kept open across
epochs, found again after the broker was unreachable, and resumed exactly after a prefix
published under other sub-entry boundaries; a stream queue consumer of AMQP 0.9.1 reads every
row once with its properties."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from runners.engine import EpochRunner
from runners.engine.destinations import build
from runners.engine.destinations.log_records import encoded_rows, position
from runners.engine.destinations.rabbitmq_entries import sub_entries
from runners.engine.destinations.rabbitmq_streams import (
    RabbitMQSinkError,
    RabbitMQStreamsSink,
    properties_section,
)
from runners.engine.rabbitmq_stream import create_stream, delete_stream
from runners.engine.sinks import SINKS, Held, output_of
from snapshots_store import Repository
from tests.engine.destinations.support import TcpProxy, contents
from tests.engine.jobs import aggregate_job
from tests.engine.test_kafka_sink import output_by_epoch


def test_sub_entries_hold_every_row_once_as_the_client_reads_them() -> None:
    from rstream import amqp_decoder
    from rstream.schema import SubEntryChunk

    rows = [b'{"k":%d}' % i for i in range(500)]
    rows[7] = b'{"long":"' + b"x" * 300 + b'"}'  # a body past a vbin8's 255 bytes
    rows[400] = b'{"huge":"' + b"y" * 5000 + b'"}'  # larger than an entry may be: alone
    head = properties_section({"epochal-epoch": "3", "epochal-snapshot": "s" * 64})
    entries = sub_entries(rows, head, max_messages=60, max_bytes=4096)

    assert [e.first for e in entries] == [0] + [e.last + 1 for e in entries[:-1]]
    assert entries[-1].last == len(rows) - 1
    assert all(e.count <= 60 and (len(e.data) <= 4096 or e.count == 1) for e in entries)
    assert any(e.first == e.last == 400 for e in entries)
    read = []
    for entry in entries:  # the entry as the broker delivers it: type, count, sizes, data
        size = len(entry.data).to_bytes(4, "big")
        chunk = entry.count.to_bytes(2, "big") + size + size + entry.data
        messages, length = SubEntryChunk.read(chunk, 0x80, 0)
        assert length == len(chunk) and len(messages) == entry.count
        read += messages
    decoded = [amqp_decoder(m) for m in read]
    assert [m.body for m in decoded] == rows
    assert all(
        {k.decode(): v.decode() for k, v in m.application_properties.items()}
        == {"epochal-epoch": "3", "epochal-snapshot": "s" * 64}
        for m in decoded
    )
    assert sub_entries([], head, max_messages=60, max_bytes=4096) == []


@pytest.fixture
def streams(rabbitmq_stream_url: str) -> Iterator[list[str]]:
    names = [f"epochal-test-publish-{uuid.uuid4().hex[:10]}" for _ in range(2)]
    for name in names:
        create_stream(rabbitmq_stream_url, name)
    yield names
    for name in names:
        delete_stream(rabbitmq_stream_url, name)


@pytest.mark.spark
@pytest.mark.services
def test_one_connection_per_sink_across_epochs_and_exact_retries(
    spark: Any, tmp_path: Path, epochs_dir: str, rabbitmq_stream_url: str,
    rabbitmq_url: str, streams: list[str],
) -> None:  # fmt: skip
    port = urlsplit(rabbitmq_stream_url).port or 5552
    proxy = TcpProxy(("127.0.0.1", port))
    via = rabbitmq_stream_url.replace(f":{port}/", f":{proxy.port}/")
    first, second = streams
    config = {"url": via, "batch_size": 40, "load_balancer": True}
    sink = build("rabbit", "rabbitmq_streams", {**config, "stream": first})
    repo = Repository.open(f"file://{tmp_path}/store", "publish")
    runner = EpochRunner(spark, aggregate_job(epochs_dir, sinks=[sink]), repo=repo)
    try:
        # epoch 1's commit overlaps epoch 2's tasks (the catch-up driver): both are done,
        # their connections open, after epoch 2
        assert runner.run_epoch() is not None and runner.run_epoch() is not None
        opened = proxy.accepted
        assert len(runner.run(max_epochs=2)) == 2
        assert proxy.accepted == opened  # epochs 3 and 4 opened no connection
        expected = output_by_epoch(repo)
        direct = build("reader", "rabbitmq_streams", {"url": rabbitmq_stream_url, "stream": first})
        assert sorted(expected) == [1, 2, 3, 4] and contents(direct) == expected
        assert _stream_queue_rows(rabbitmq_url, first) == expected

        # another sink publishes the same epochs again from the store: a prefix of epoch 1
        # under boundaries of 7 rows, then the whole epoch under boundaries of 40; then the
        # broker is unreachable for a while, and the same sink finds it again
        retry = build("rabbit", "rabbitmq_streams", {**config, "stream": second})
        outputs = _committed_outputs(repo)
        staged, output = outputs[0]
        rows = encoded_rows(output)
        head = properties_section({"epochal-epoch": "1", "epochal-snapshot": output.snapshot_id})
        prefix = sub_entries(rows[:30], head, max_messages=7, max_bytes=1 << 19)
        writer, start = str(staged["identity"]), position(int(staged["generation"]), 1, 0)
        retry._call(lambda s: s.publish(retry.producer_name(writer),
                                        [(start + e.last, e) for e in prefix]))  # fmt: skip
        assert retry.top(writer) == start + 29
        retry.commit(output, staged)
        proxy.cut()
        with pytest.raises(RabbitMQSinkError, match=f"stream {second!r}"):
            retry.commit(outputs[1][1], outputs[1][0])
        proxy.restore()
        for staged, output in outputs[1:]:
            retry.commit(output, staged)
        assert retry.committed(outputs[-1][0]) == Held(4, outputs[-1][1].snapshot_id)
        reader = build("reader", "rabbitmq_streams", {"url": rabbitmq_stream_url, "stream": second})
        assert contents(reader) == expected  # every row once
        retry.close()
    finally:
        sink.close()
        proxy.close()


def _committed_outputs(repo: Repository) -> list[tuple[dict[str, Any], Any]]:
    """(the sink's pending record, the epoch's output) of each epoch of main, in order."""
    found = []
    for snapshot_id, manifest in repo.log("heads/main", first_parent=True):
        entry = (manifest.extra.get(SINKS) or {}).get("rabbit")
        if isinstance(entry, dict):
            output = output_of(repo, "publish", manifest, snapshot_id, entry)
            found.append((entry["staged"], output))
    return sorted(found, key=lambda f: f[1].epoch)


def _stream_queue_rows(amqp_url: str, stream: str) -> dict[int, list[str]]:
    """Every message of `stream` read by an AMQP 0.9.1 stream queue consumer from its first
    offset: the rows per `epochal-epoch` header, as sorted JSON text."""
    import amqp

    parts = urlsplit(amqp_url)
    connection = amqp.Connection(f"{parts.hostname}:{parts.port or 5672}",
                                 userid=parts.username or "guest",
                                 password=parts.password or "guest")  # fmt: skip
    connection.connect()
    got: dict[int, list[str]] = {}
    try:
        channel = connection.channel()
        channel.basic_qos(0, 500, False)

        def on_message(message: Any) -> None:
            epoch = int(message.properties["application_headers"]["epochal-epoch"])
            got.setdefault(epoch, []).append(json.dumps(json.loads(message.body), sort_keys=True))
            channel.basic_ack(message.delivery_tag)

        channel.basic_consume(stream, callback=on_message,
                              arguments={"x-stream-offset": "first"})  # fmt: skip
        deadline = time.monotonic() + 30
        quiet = 0
        while quiet < 2 and time.monotonic() < deadline:
            try:
                connection.drain_events(timeout=1)
                quiet = 0
            except TimeoutError:
                quiet += 1
    finally:
        connection.close()
    return {e: sorted(rows) for e, rows in got.items()}


@pytest.mark.services
def test_a_closed_sink_asks_again_on_new_connections(rabbitmq_stream_url: str) -> None:
    """`close` ends the session's thread; the next question opens a new one."""
    sink = RabbitMQStreamsSink(url=rabbitmq_stream_url, stream=f"epochal-absent-{uuid.uuid4().hex}")
    with pytest.raises(ValueError, match="does not exist"):
        sink.top("ns/main")
    sink.close()
    with pytest.raises(ValueError, match="does not exist"):
        sink.top("ns/main")
    sink.close()
