"""The runners' configuration: read from the environment once per process, typed, each
default written once."""

from __future__ import annotations

import dataclasses
import os

import pytest

from runners import config
from runners.config import MB, ConfigError, RunnersConfig
from runners.engine.exchange import exchange_root
from runners.launchers import get_launcher


def test_an_empty_environment_gives_the_defaults() -> None:
    settings = RunnersConfig.from_environ({})
    assert settings == RunnersConfig()
    assert settings.state_cache_disk_bytes == 4096 * MB
    assert settings.restore_read_ahead_bytes == 256 * MB
    assert (settings.runner, settings.spark_master, settings.run_id) == ("local", "local[2]", None)
    assert settings.state_cache_path.endswith(f"epochal-state-cache-{os.getuid()}")


def test_values_are_read_and_typed() -> None:
    settings = RunnersConfig.from_environ(
        {
            "EPOCHAL_RUN_ID": "run-7",
            "EPOCHAL_STATE_CACHE_DISK_MB": "0",
            "EPOCHAL_RESTORE_READ_AHEAD_MB": " 16 ",
            "EPOCHAL_STATE_CACHE_DIR": "/cache",
            "RUNNER": " Kubernetes ",
            "EPOCHAL_IMAGE": "  ",
            "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        }
    )
    assert settings.run_id == "run-7" and settings.state_cache_disk_bytes == 0
    assert settings.restore_read_ahead_bytes == 16 * MB
    assert settings.state_cache_path == "/cache"
    assert settings.runner == "kubernetes" and settings.image is None and settings.in_cluster
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.runner = "local"  # type: ignore[misc]


def test_a_bad_number_names_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"\$EPOCHAL_STATE_CACHE_DISK_MB must be a whole number"):
        RunnersConfig.from_environ({"EPOCHAL_STATE_CACHE_DISK_MB": "lots"})


def test_read_once_until_reloaded(monkeypatch: pytest.MonkeyPatch) -> None:
    first = config.reload()  # (the test fixtures give the next test its configuration back)
    # os.environ changed behind the process's back (not through monkeypatch.setenv)
    monkeypatch.setitem(os.environ, "EPOCHAL_EXCHANGE_DIR", "/shared/exchange")
    assert config.current() is first  # the environment changed: the process did not re-read
    assert exchange_root("spark://m:7077") == first.exchange_dir
    assert config.reload().exchange_dir == "/shared/exchange"
    assert exchange_root("spark://m:7077") == "/shared/exchange"
    previous = config.use(dataclasses.replace(first, runner="standalone"))
    assert previous.exchange_dir == "/shared/exchange"
    with pytest.raises(Exception, match="SPARK_STANDALONE_MASTER"):
        get_launcher()  # the configured runner, which lacks its master URL
