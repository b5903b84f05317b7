"""`python -m bench.sinks`: the RabbitMQ Streams sink (a stream on $RABBITMQ_STREAM_URL,
default the local broker), measured by bench/sinks/paired_runs.py. Target: ratio_with_sink >=
0.5."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.sinks.paired_runs import measure_sink

TARGET = 0.5


def destination(run: str) -> tuple[str, dict[str, Any], Callable[[], None]]:
    from runners.engine.rabbitmq_stream import create_stream, delete_stream

    url = os.environ.get("RABBITMQ_STREAM_URL", "rabbitmq-stream://guest:guest@127.0.0.1:5552/%2F")
    stream = f"epochal-bench-sink-{run}-{uuid.uuid4().hex[:8]}"
    create_stream(url, stream)
    return "rabbitmq_streams", {"url": url, "stream": stream}, lambda: delete_stream(url, stream)


def measure(*, records_per_epoch: int, epochs: int, workdir: Path) -> dict[str, Any]:
    return measure_sink(destination, records_per_epoch=records_per_epoch, epochs=epochs,
                        workdir=workdir, target=TARGET)  # fmt: skip
