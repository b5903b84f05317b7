"""`python -m bench.sinks`: the Redis Streams sink (a stream on $REDIS_URL, default the local
server), measured by bench/sinks/paired_runs.py. Target: ratio_with_sink >= 0.5."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.sinks.paired_runs import measure_sink

TARGET = 0.5


def destination(run: str) -> tuple[str, dict[str, Any], Callable[[], None]]:
    import redis

    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    stream = f"epochal-bench-sink-{run}-{uuid.uuid4().hex[:8]}"

    def cleanup() -> None:
        redis.Redis.from_url(url).delete(stream, stream + "#epochal")

    return "redis_streams", {"url": url, "stream": stream}, cleanup


def measure(*, records_per_epoch: int, epochs: int, workdir: Path) -> dict[str, Any]:
    return measure_sink(destination, records_per_epoch=records_per_epoch, epochs=epochs,
                        workdir=workdir, target=TARGET)  # fmt: skip
