"""`python -m bench.sinks`: the RabbitMQ Streams sink (a stream on $RABBITMQ_STREAM_URL,
default the local broker), measured by bench/sinks/paired_runs.py, with the sink's publishing
settings in the result. Target: ratio_with_sink >= 0.5."""

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
    from runners.engine.destinations.rabbitmq_streams import FRAME_BYTES, RabbitMQStreamsSink

    result = measure_sink(destination, records_per_epoch=records_per_epoch, epochs=epochs,
                          workdir=workdir, target=TARGET)  # fmt: skip
    # the sink's publishing settings (its defaults: the bench registers only url and stream)
    defaults = RabbitMQStreamsSink(url="rabbitmq-stream://u:p@h:5552/v", stream="s")
    result["settings"] = {"batch_size": defaults.batch_size, "sub_entry_max_bytes": FRAME_BYTES,
                          "load_balancer": defaults.load_balancer}  # fmt: skip
    return result
