"""The destinations a registered sink names: kind -> the class building it from its config.

A version names registered sinks (the control plane's sink registry); the job spec carries
each one's name, kind and config, and the engine builds it here (`build`). Every class
implements the Sink protocol (runners/engine/sinks.py) and a ``from_config(name, config)``
that refuses a bad config with a ValueError naming the sink and the field.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

KINDS: dict[str, str] = {
    "delta": "runners.engine.destinations.delta:DeltaSink",
    "iceberg": "runners.engine.destinations.iceberg:IcebergSink",
    "kafka": "runners.engine.destinations.kafka:KafkaDestination",
    "postgres": "runners.engine.destinations.postgres:PostgresSink",
    "rabbitmq_streams": "runners.engine.destinations.rabbitmq_streams:RabbitMQStreamsSink",
    "redis_streams": "runners.engine.destinations.redis_streams:RedisStreamsSink",
}


def build(name: str, kind: str, config: Mapping[str, Any]) -> Any:
    """The sink `name` of `kind` built from `config` (ValueError naming the bad field)."""
    if kind not in KINDS:
        raise ValueError(f"sink {name!r}: kind: {kind!r} is not one of {', '.join(sorted(KINDS))}")
    if not isinstance(config, Mapping):
        raise ValueError(f"sink {name!r}: config: must be a JSON object")
    module, _, cls = KINDS[kind].partition(":")
    return getattr(importlib.import_module(module), cls).from_config(name, config)


__all__ = ["KINDS", "build"]
