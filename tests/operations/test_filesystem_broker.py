"""The embedded broker's messages are whole when a consumer in another process takes them:
kombu's filesystem transport creates a message file, then writes it, and a consumer polling
the folder meanwhile read an empty file and died (a worker of the demo did, in a test of its
restarts). `controlplane.broker` writes each message under a name no queue matches and
renames it into place."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection, Exchange, Queue

MESSAGES = 300
PAYLOAD = "x" * 400_000  # a large message: a long write, a wide window for the race


def options(folder: Path) -> dict[str, Any]:
    for sub in ("out", "processed", "control"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(folder / "out"),
        "data_folder_out": str(folder / "out"),
        "processed_folder": str(folder / "processed"),
        "control_folder": str(folder / "control"),
        "store_processed": False,
        "polling_interval": 0.0,
    }


def exchange_messages(transport: str, folder: Path) -> tuple[int, list[BaseException]]:
    """Send MESSAGES while another connection consumes them as fast as it can; (received,
    the consumer's errors)."""
    queue = Queue("q", Exchange("q", type="direct"), routing_key="q")
    received: list[int] = []
    errors: list[BaseException] = []
    sent = threading.Event()

    def consume() -> None:
        with (
            Connection(
                "filesystem://", transport=transport, transport_options=options(folder)
            ) as c,
            c.SimpleQueue(queue) as q,
        ):
            while len(received) < MESSAGES:
                try:
                    message = q.get(timeout=0.05)
                except q.Empty:
                    if sent.is_set() and not list((folder / "out").glob("*.msg")):
                        return
                    continue
                except Exception as exc:
                    errors.append(exc)
                    return
                received.append(len(message.payload))
                message.ack()

    consumer = threading.Thread(target=consume)
    with (
        Connection("filesystem://", transport=transport, transport_options=options(folder)) as c,
        c.SimpleQueue(queue) as q,
    ):
        consumer.start()
        for _ in range(MESSAGES):
            q.put(PAYLOAD)
    sent.set()
    consumer.join(timeout=120)
    return len(received), errors


@pytest.mark.parametrize("transport", ["controlplane.broker:Transport"])
def test_a_consumer_never_reads_a_half_written_message(transport: str, tmp_path: Path) -> None:
    received, errors = exchange_messages(transport, tmp_path)
    assert errors == [] and received == MESSAGES
