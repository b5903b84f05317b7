"""StandaloneLauncher: the driver on this machine, executors on a Spark standalone cluster.

`spark-submit --master spark://HOST:PORT` in client mode, as Spark users run against an
existing standalone cluster: the run's driver is a local process group exactly as with the
local launcher (same run directory, status, logs, stop and cleanup contract), while its tasks
run in executor JVMs that the cluster's workers start on their own machines. Each executor keeps
its own state cache (`EPOCHAL_STATE_CACHE_DIR` of its worker, or the worker's temp directory):
nothing is shared through a local disk, so a key group an executor does not have is restored
from the store, which must therefore be one every worker reaches (an object store).

The master URL, and where the workers find the Python interpreter and the code, are an
admin's settings (environment of the control plane), never an operator's:

- `SPARK_STANDALONE_MASTER`: `spark://host:7077` (several masters: `spark://h1:7077,h2:7077`)
- `SPARK_STANDALONE_EXECUTOR_PYTHON`: the Python the executors run (default: the driver's)
- `SPARK_STANDALONE_EXECUTOR_PYTHONPATH`: where the executors import the engine and the
  installed jobs from (default: the driver's `PYTHONPATH`)

A live rescale sizes the application's executors (runners/engine/executors.py): one executor of
`resources.executor_cores` cores per that many tasks, added with `requestTotalExecutors` and
removed at an epoch boundary, as on Kubernetes. Warm standbys are a local-launcher feature: a
standby driver here would hold cluster executors while it waits, so none is started.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from runners import config
from runners.config import RunnersConfig
from runners.job_spec import JobSpec
from runners.launcher import LauncherError, pyspark_submit_args
from runners.local import CREDENTIAL_NAMES, LocalLauncher

MASTER_ENV: Final = config.STANDALONE_MASTER_ENV
_MASTER: Final = re.compile(r"spark://[A-Za-z0-9.\-]+:\d{1,5}(,[A-Za-z0-9.\-]+:\d{1,5})*")


def checked_master(url: str) -> str:
    """`url` when it is a standalone master URL; a LauncherError naming the setting if not."""
    if not _MASTER.fullmatch(url):
        raise LauncherError(
            f"{MASTER_ENV}={url!r} is not a standalone master URL: "
            "expected spark://HOST:PORT (or spark://H1:P1,H2:P2 for several masters)"
        )
    return url


class StandaloneLauncher(LocalLauncher):
    """Runs the driver as a local process group and its executors on a standalone cluster."""

    name = "standalone"

    def __init__(
        self,
        *,
        master: str,
        executor_python: str | None = None,
        executor_pythonpath: str | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.master = checked_master(master)
        self.executor_python = executor_python or self.python
        self.executor_pythonpath = executor_pythonpath

    @classmethod
    def from_config(cls, settings: RunnersConfig) -> StandaloneLauncher:
        master = settings.standalone_master
        if not master:
            raise LauncherError(
                f"RUNNER=standalone needs {MASTER_ENV}=spark://HOST:PORT (an admin's setting: "
                "the cluster's master URL)"
            )
        local = LocalLauncher.from_config(settings)
        return cls(
            master=master,
            executor_python=settings.standalone_executor_python,
            executor_pythonpath=settings.standalone_executor_pythonpath,
            runs_dir=local.runs_dir,
        )

    def spark_conf(self, spec: JobSpec, env: Mapping[str, str]) -> dict[str, str]:
        """The job's Spark settings with the cluster's: executor size, Python, code path."""
        resources = spec.resources
        pythonpath = self.executor_pythonpath or env.get("PYTHONPATH", "")
        conf = {
            "spark.executor.cores": str(resources.executor_cores),
            "spark.executor.memory": f"{resources.executor_memory_mb}m",
            "spark.pyspark.python": self.executor_python,
            "spark.executorEnv.PYTHONPATH": pythonpath,
            "spark.executorEnv.PYTHONUNBUFFERED": "1",
            # the store's credentials: executors read and write state in the store themselves
            # (Spark redacts secret-looking values in its UI and logs)
            **{f"spark.executorEnv.{k}": env[k] for k in CREDENTIAL_NAMES if env.get(k)},
        }
        # The launcher's keys win: the interpreter and code path are places an admin chose.
        return {**spec.spark_conf, **conf}

    def environment(self, spec: JobSpec) -> dict[str, str]:
        env = super().environment(spec)
        env["SPARK_MASTER"] = self.master
        env["PYSPARK_PYTHON"] = self.executor_python
        env["PYSPARK_SUBMIT_ARGS"] = pyspark_submit_args(
            self.master, self.spark_conf(spec, env), spec.resources.driver_memory_mb
        )
        return env

    def _standby(self, spec: JobSpec) -> bool:
        return False
