"""A log or Iceberg sink's password comes from the environment variable its registration names
(``password_env``, from ``credentials_env``), read when it connects — never from its URL, which
the registry refuses with a password in it (tests/api/test_sink_registry.py)."""

from __future__ import annotations

import uuid
from urllib.parse import unquote, urlsplit

import pytest

from runners.engine.destinations import build
from runners.engine.destinations.fields import with_password
from runners.engine.rabbitmq_stream import create_stream, delete_stream

VARIABLE = "EPOCHAL_TEST_SINK_PASSWORD"


def test_the_variables_password_goes_into_the_url_only_when_connecting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = "rabbitmq-stream://app@broker.internal:5552/%2F"
    assert with_password(url, "", "rabbitmq_streams", "out") == url  # no variable named
    monkeypatch.setenv(VARIABLE, "p@ss:/word")
    parts = urlsplit(with_password(url, VARIABLE, "rabbitmq_streams", "out"))
    assert (parts.username, unquote(parts.password or "")) == ("app", "p@ss:/word")
    assert (parts.hostname, parts.port, parts.path) == ("broker.internal", 5552, "/%2F")
    monkeypatch.delenv(VARIABLE)
    with pytest.raises(ValueError, match=f"sink 'out' .*password_env: {VARIABLE} is not set"):
        with_password(url, VARIABLE, "rabbitmq_streams", "out")
    with pytest.raises(ValueError, match="field 'password_env' must name an environment"):
        build("out", "redis_streams", {"url": "redis://h/0", "stream": "s", "password_env": "A-B"})


@pytest.mark.services
def test_a_rabbitmq_sink_authenticates_with_the_password_its_variable_holds(
    rabbitmq_stream_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = urlsplit(rabbitmq_stream_url)
    assert parts.password, "the test broker's URL names its password"
    bare = parts._replace(netloc=f"{parts.username}@{parts.hostname}:{parts.port}").geturl()
    stream = f"epochal-test-pw-{uuid.uuid4().hex[:10]}"
    create_stream(rabbitmq_stream_url, stream)
    config = {"url": bare, "stream": stream, "password_env": VARIABLE}
    try:
        monkeypatch.setenv(VARIABLE, unquote(parts.password))
        sink = build("out", "rabbitmq_streams", config)
        sink.check()  # the broker answers and the stream exists: authenticated
        sink.close()
        monkeypatch.setenv(VARIABLE, "not-the-password")
        sink = build("out", "rabbitmq_streams", config)
        with pytest.raises(ValueError) as refused:
            sink.check()
        assert "not-the-password" not in str(refused.value)  # errors never show it
        sink.close()
    finally:
        delete_stream(rabbitmq_stream_url, stream)
