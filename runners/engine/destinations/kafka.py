"""The Kafka destination: the exactly-once Kafka sink (runners/engine/kafka_sink.py) built
from a registered sink's config (``bootstrap_servers``, ``topic``, ``config``: further
librdkafka settings, ``transaction_timeout_ms``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from runners.engine.kafka_sink import KafkaSink

FIELDS = ("bootstrap_servers", "topic", "config", "transaction_timeout_ms")


class KafkaDestination(KafkaSink):
    @classmethod
    def from_config(cls, name: str, config: Mapping[str, Any]) -> Self:
        unknown = sorted(set(config) - set(FIELDS))
        if unknown:
            raise ValueError(
                f"sink {name!r}: {unknown[0]}: unknown field (known: {', '.join(FIELDS)})"
            )
        for key in ("bootstrap_servers", "topic"):
            if not isinstance(config.get(key), str):
                raise ValueError(f"sink {name!r}: {key}: required (a string)")
        try:
            return cls(name=name, **{k: config[k] for k in FIELDS if k in config})
        except (TypeError, ValueError) as exc:
            text = str(exc)
            field = next((k for k in FIELDS if k in text), "config")
            raise ValueError(f"sink {name!r}: {field}: {text}") from None


__all__ = ["KafkaDestination"]
