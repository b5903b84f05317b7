"""Destinations of the exactly-once sinks (sinks.py), one module per kind.

`KINDS` maps a kind (what an admin registers a sink as) to the class implementing it, as
``"module:Class"`` so that building one sink imports only its own client library; `build`
makes the sink from its registered config (each class's ``from_config`` validates it and names
the sink and the field of anything wrong).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

KINDS: dict[str, str] = {
    "iceberg": "runners.engine.destinations.iceberg:IcebergSink",
    "rabbitmq_streams": "runners.engine.destinations.rabbitmq_streams:RabbitMQStreamsSink",
    "redis_streams": "runners.engine.destinations.redis_streams:RedisStreamsSink",
}


def build(name: str, kind: str, config: Mapping[str, Any]) -> Any:
    """The sink `name` of `kind` from its config (ValueError naming the sink and the field)."""
    if kind not in KINDS:
        raise ValueError(f"sink {name!r}: unknown kind {kind!r}; known kinds: {sorted(KINDS)}")
    module, _, cls = KINDS[kind].partition(":")
    return getattr(importlib.import_module(module), cls).from_config(name, config)


__all__ = ["KINDS", "build"]
