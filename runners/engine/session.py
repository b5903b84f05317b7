"""Build the SparkSession the engine runs in, with the settings our machines need."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from runners import config

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Settings that keep a local session quiet (see docs/engine.md). The JVM runs with its own
# defaults (C2 compiler, default GC): a job's version may set spark.driver.extraJavaOptions.
DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.python.worker.reuse": "true",
}


def session_conf(
    conf: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """What the builder sets: `DEFAULT_CONF` but for the keys the run's submitted settings
    (``PYSPARK_SUBMIT_ARGS``: a version's `spark_conf`, the launcher's) already give — the
    builder's settings would override them — then `conf`."""
    from runners.engine.spark_ui import submitted_conf

    submitted = submitted_conf(config.environment() if env is None else env)
    defaults = {key: value for key, value in DEFAULT_CONF.items() if key not in submitted}
    return {**defaults, **(conf or {})}


def build_spark_session(
    *,
    master: str | None = None,
    app_name: str = "epochal",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Return a SparkSession for `master` (default `SPARK_MASTER` or `local[2]`).

    Reuses the active session when one exists, so a test run or a job pays the JVM start once.
    """
    from pyspark.sql import SparkSession

    # py4j logs "Closing down clientserver connection" from __del__ at interpreter exit, when
    # the log stream may already be closed; its INFO lines carry nothing an operator needs.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # Python workers must run the driver's interpreter (the venv with pyarrow, mmh3, …).
    config.update_environment(
        {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}, only_missing=True
    )
    builder = SparkSession.builder.master(master or config.current().spark_master)
    builder = builder.appName(app_name)
    for key, value in session_conf(conf).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
