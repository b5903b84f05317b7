"""The Spark UI of a job's run: on unless the run's submitted Spark settings turn it off.

A library or test session keeps the UI off (`runners.engine.session.DEFAULT_CONF`); a job's
driver turns it on, since every Spark user debugs a slow epoch in it (stages, tasks, skew,
executors, SQL plans). An admin turns it off per version with
``spark.ui.enabled: "false"`` in the version's `spark_conf`, which reaches the driver in
``PYSPARK_SUBMIT_ARGS``. The address the UI actually bound (`SparkContext.uiWebUrl`) goes
into the run's `started` event, where the control plane reads it (docs/control-plane.md).
"""

from __future__ import annotations

import itertools
import shlex
from collections.abc import Mapping
from typing import Any, Final

from runners import config

UI_ENABLED: Final = "spark.ui.enabled"


def submitted_conf(env: Mapping[str, str]) -> dict[str, str]:
    """The ``--conf KEY=VALUE`` settings of ``PYSPARK_SUBMIT_ARGS`` in `env`."""
    words = shlex.split(env.get("PYSPARK_SUBMIT_ARGS", ""))
    conf: dict[str, str] = {}
    for flag, value in itertools.pairwise(words):
        if flag == "--conf" and "=" in value:
            key, _, setting = value.partition("=")
            conf[key] = setting
    return conf


def job_session_conf(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a job's driver session sets over the library defaults: the UI on, unless the
    submitted settings (the version's) say otherwise."""
    submitted = submitted_conf(config.environment() if env is None else env)
    return {UI_ENABLED: submitted.get(UI_ENABLED, "true")}


def ui_address(spark: Any) -> str | None:
    """Where the session's UI listens (``http://host:port``), None when it is off."""
    url = spark.sparkContext.uiWebUrl
    return str(url) if url else None
