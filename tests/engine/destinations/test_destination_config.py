"""Bad sink configuration is refused before anything runs, naming the sink and the field."""

from __future__ import annotations

from typing import Any

import pytest

from runners.engine.destinations import KINDS, build
from runners.engine.destinations.log_records import CannotUnpublishError

ICEBERG = {"catalog_uri": "sqlite:////tmp/c.db", "warehouse": "/tmp/wh", "table": "a.b"}
REDIS = {"url": "redis://127.0.0.1:6379/0", "stream": "out"}
RABBIT = {"url": "rabbitmq-stream://guest:guest@127.0.0.1:5552/%2F", "stream": "out"}


@pytest.mark.parametrize(
    ("kind", "config", "message"),
    [
        ("iceberg", {**ICEBERG, "catalog_uri": "mysql://x"}, "field 'catalog_uri' must be"),
        ("iceberg", {**ICEBERG, "warehouse": "relative/dir"}, "field 'warehouse' must be"),
        ("iceberg", {**ICEBERG, "table": "no_namespace"}, "field 'table' must be <namespace>"),
        ("iceberg", {**ICEBERG, "create_table": "yes"}, "field 'create_table' must be bool"),
        ("iceberg", {"warehouse": "/w", "table": "a.b"}, "field 'catalog_uri' is required"),
        ("redis_streams", {**REDIS, "url": "http://x"}, "field 'url' must be redis://"),
        ("redis_streams", {**REDIS, "stream": "out#epochal"}, "field 'stream' must be"),
        ("redis_streams", {**REDIS, "batch_size": 0}, "field 'batch_size' must be between"),
        ("redis_streams", {**REDIS, "batch_size": True}, "field 'batch_size' must be int"),
        ("redis_streams", {**REDIS, "payload_field": "epoch"}, "field 'payload_field'"),
        ("rabbitmq_streams", {**RABBIT, "url": "amqp://x"}, "field 'url'"),
        ("rabbitmq_streams", {**RABBIT, "stream": ""}, "field 'stream' must name a stream"),
        ("rabbitmq_streams", {**RABBIT, "topic": "x"}, r"unknown field\(s\) \['topic'\]"),
        ("rabbitmq_streams", {"url": RABBIT["url"]}, "field 'stream' is required"),
    ],
)
def test_a_bad_field_is_named_with_the_sink(kind: str, config: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        build("out-1", kind, config)
    assert "'out-1'" in str(caught.value)


def test_unknown_kind_bad_name_and_non_object_config_are_refused() -> None:
    with pytest.raises(ValueError, match=r"sink 'x': kind: 'kafka2' is not one of delta, iceberg"):
        build("x", "kafka2", {})
    with pytest.raises(ValueError, match="sink name 'a b'"):
        build("a b", "redis_streams", REDIS)
    with pytest.raises(ValueError, match="config: must be a JSON object"):
        build("x", "iceberg", ["catalog_uri"])  # type: ignore[arg-type]


def test_every_kind_builds_from_a_good_config_and_logs_refuse_to_unpublish() -> None:
    good = {"iceberg": ICEBERG, "redis_streams": REDIS, "rabbitmq_streams": RABBIT}
    assert set(good) <= set(KINDS)  # delta, kafka and postgres: tests/engine/test_*sink*.py
    sinks = {kind: build(f"s-{kind}", kind, config) for kind, config in good.items()}
    assert {kind: sink.name for kind, sink in sinks.items()} == {k: f"s-{k}" for k in good}
    for kind in ("redis_streams", "rabbitmq_streams"):
        with pytest.raises(CannotUnpublishError, match="cannot unpublish: the records of the "
                           "epochs after 4 stay in the log"):  # fmt: skip
            sinks[kind].rollback_to(4, namespace="app", branch="main")


def test_an_unreachable_destination_is_named_by_check_before_a_job_starts(tmp_path: Any) -> None:
    from tests.engine.destinations.support import free_port

    port = free_port()  # nothing listens there
    unreachable = {
        "iceberg": {**ICEBERG, "catalog_uri": f"postgresql+psycopg://u@127.0.0.1:{port}/db"},
        "redis_streams": {**REDIS, "url": f"redis://127.0.0.1:{port}/0"},
        "rabbitmq_streams": {**RABBIT, "url": f"rabbitmq-stream://g:g@127.0.0.1:{port}/%2F"},
    }
    for kind, config in unreachable.items():
        with pytest.raises(ValueError) as caught:
            build("out", kind, config).check()
        text = str(caught.value)
        assert "sink 'out'" in text and "unreachable" in text, text
        assert "field 'url'" in text or "field 'catalog_uri'" in text, text
    missing = build("out", "iceberg", {**ICEBERG, "catalog_uri": f"sqlite:///{tmp_path}/c.db",
                                       "create_table": False})  # fmt: skip
    with pytest.raises(ValueError, match="does not exist in catalog 'epochal' and create_table"):
        missing.check()
