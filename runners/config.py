"""The runners' configuration: every setting runners/ takes from the process environment,
read in one place, once per process, into a typed, frozen `RunnersConfig`.

`current()` reads the environment the first time it is called (a driver at start-up, a Spark
worker at its first task) and returns the same object afterwards; a process that changes its
environment on purpose (a warm standby adopting a run) calls `reload()`. Nothing else in
runners/ reads ``os.environ`` (tests/test_architecture.py checks it): a component takes the
object, or asks `current()`. Each default is written once, here.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

MB: Final = 1024**2

#: the run id a job process belongs to (set by the launchers; a stop request must name it)
RUN_ID_ENV: Final = "EPOCHAL_RUN_ID"
#: crash tests: ``<point>:<epoch>`` where the driver or a task is killed (crash.py)
CRASH_AT_ENV: Final = "EPOCHAL_CRASH_AT"
#: crash tests: only the first run that reaches the point dies (it creates this file)
CRASH_ONCE_ENV: Final = "EPOCHAL_CRASH_ONCE_FILE"
#: the machine-local directory of materialised key-group state (disk cache)
STATE_CACHE_DIR_ENV: Final = "EPOCHAL_STATE_CACHE_DIR"
STATE_CACHE_DISK_MB_ENV: Final = "EPOCHAL_STATE_CACHE_DISK_MB"
RESTORE_READ_AHEAD_MB_ENV: Final = "EPOCHAL_RESTORE_READ_AHEAD_MB"
#: a directory every executor sees, for the split routing's exchange files
EXCHANGE_DIR_ENV: Final = "EPOCHAL_EXCHANGE_DIR"
SPARK_MASTER_ENV: Final = "SPARK_MASTER"
RUNNER_ENV: Final = "RUNNER"
VAR_DIR_ENV: Final = "EPOCHAL_VAR_DIR"
STANDALONE_MASTER_ENV: Final = "SPARK_STANDALONE_MASTER"
STANDALONE_EXECUTOR_PYTHON_ENV: Final = "SPARK_STANDALONE_EXECUTOR_PYTHON"
STANDALONE_EXECUTOR_PYTHONPATH_ENV: Final = "SPARK_STANDALONE_EXECUTOR_PYTHONPATH"
K8S_NAMESPACE_ENV: Final = "EPOCHAL_K8S_NAMESPACE"
IMAGE_ENV: Final = "EPOCHAL_IMAGE"
IMAGE_PULL_SECRETS_ENV: Final = "EPOCHAL_IMAGE_PULL_SECRETS"
JOB_SERVICE_ACCOUNT_ENV: Final = "EPOCHAL_JOB_SERVICE_ACCOUNT"
STORE_CREDENTIALS_SECRET_ENV: Final = "EPOCHAL_STORE_CREDENTIALS_SECRET"
KUBECONFIG_ENV: Final = "KUBECONFIG"
IN_CLUSTER_ENV: Final = "KUBERNETES_SERVICE_HOST"


class ConfigError(ValueError):
    """An environment variable of the runners holds a value they cannot use."""


def _megabytes(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
        return default * MB
    try:
        return int(raw) * MB
    except ValueError:
        raise ConfigError(f"${name} must be a whole number of megabytes, not {raw!r}") from None


def _text(environ: Mapping[str, str], name: str) -> str | None:
    """The variable's value, stripped; None when unset or empty."""
    return environ.get(name, "").strip() or None


@dataclass(frozen=True)
class RunnersConfig:
    """What the runners take from the environment (see the module docstring)."""

    #: the job process's run id (None: stop requests are ignored)
    run_id: str | None = None
    #: the raw crash spec ``<point>:<epoch>`` (crash tests only; None: no crash)
    crash_at: str | None = None
    crash_once_file: str | None = None
    #: the state disk cache's directory (None: ``$TMPDIR/epochal-state-cache-<uid>``)
    state_cache_dir: str | None = None
    #: the state disk cache's budget; 0 turns the disk cache off
    state_cache_disk_bytes: int = 4096 * MB
    #: stored bytes a restore task asks the store to read ahead of its claims (0: none)
    restore_read_ahead_bytes: int = 256 * MB
    #: the exchange directory shared by the executors (None: a local one for a local master)
    exchange_dir: str | None = None
    #: the Spark master of a job process without --master
    spark_master: str = "local[2]"
    #: which launcher runs jobs: local, standalone, kubernetes
    runner: str = "local"
    #: the local launcher's run directories (None: var/ in the project)
    var_dir: str | None = None
    standalone_master: str | None = None
    standalone_executor_python: str = sys.executable
    standalone_executor_pythonpath: str | None = None
    k8s_namespace: str | None = None
    image: str | None = None
    #: comma-separated image pull secrets, as given
    image_pull_secrets: str = ""
    job_service_account: str | None = None
    store_credentials_secret: str | None = None
    kubeconfig: str | None = None
    #: whether this process runs inside a Kubernetes pod
    in_cluster: bool = False

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> RunnersConfig:
        env = os.environ if environ is None else environ
        default = cls()
        return cls(
            run_id=env.get(RUN_ID_ENV) or None,
            crash_at=_text(env, CRASH_AT_ENV),
            crash_once_file=env.get(CRASH_ONCE_ENV) or None,
            state_cache_dir=env.get(STATE_CACHE_DIR_ENV) or None,
            state_cache_disk_bytes=_megabytes(
                env, STATE_CACHE_DISK_MB_ENV, default.state_cache_disk_bytes // MB
            ),
            restore_read_ahead_bytes=_megabytes(
                env, RESTORE_READ_AHEAD_MB_ENV, default.restore_read_ahead_bytes // MB
            ),
            exchange_dir=env.get(EXCHANGE_DIR_ENV) or None,
            spark_master=env.get(SPARK_MASTER_ENV) or default.spark_master,
            runner=(_text(env, RUNNER_ENV) or default.runner).lower(),
            var_dir=env.get(VAR_DIR_ENV) or None,
            standalone_master=_text(env, STANDALONE_MASTER_ENV),
            standalone_executor_python=(
                env.get(STANDALONE_EXECUTOR_PYTHON_ENV) or default.standalone_executor_python
            ),
            standalone_executor_pythonpath=env.get(STANDALONE_EXECUTOR_PYTHONPATH_ENV) or None,
            k8s_namespace=_text(env, K8S_NAMESPACE_ENV),
            image=_text(env, IMAGE_ENV),
            image_pull_secrets=env.get(IMAGE_PULL_SECRETS_ENV, default.image_pull_secrets),
            job_service_account=_text(env, JOB_SERVICE_ACCOUNT_ENV),
            store_credentials_secret=_text(env, STORE_CREDENTIALS_SECRET_ENV),
            kubeconfig=env.get(KUBECONFIG_ENV) or None,
            in_cluster=bool(env.get(IN_CLUSTER_ENV)),
        )

    @property
    def state_cache_path(self) -> str:
        """The state disk cache's directory."""
        return self.state_cache_dir or os.path.join(
            tempfile.gettempdir(), f"epochal-state-cache-{os.getuid()}"
        )


_current: RunnersConfig | None = None


def current() -> RunnersConfig:
    """This process's configuration, read from the environment on first use."""
    global _current
    if _current is None:
        _current = RunnersConfig.from_environ()
    return _current


def reload() -> RunnersConfig:
    """Read the environment again (after this process changed it on purpose)."""
    global _current
    _current = RunnersConfig.from_environ()
    return _current


def use(configuration: RunnersConfig) -> RunnersConfig:
    """Make `configuration` this process's (a benchmark or a test varying one setting);
    returns the one it replaces."""
    global _current
    previous = current()
    _current = configuration
    return previous


def environment() -> dict[str, str]:
    """A copy of this process's environment, for a child process (a job, a Spark worker)."""
    return dict(os.environ)


def update_environment(values: Mapping[str, str], *, only_missing: bool = False) -> None:
    """Set environment variables of this process, for what reads them later (the JVM,
    PySpark's workers, a job process started afterwards). `only_missing`: keep those already
    set (defaults for the JVM; the configuration is not re-read). Otherwise the process takes
    on the values as if it had started with them: the configuration is read again (a warm
    standby adopting a run)."""
    for name, value in values.items():
        if only_missing:
            os.environ.setdefault(name, value)
        else:
            os.environ[name] = value
    if not only_missing:
        reload()


__all__ = [
    "RUN_ID_ENV",
    "ConfigError",
    "RunnersConfig",
    "current",
    "environment",
    "reload",
    "update_environment",
    "use",
]


def secret(name: str) -> str | None:
    """The value of the environment variable an admin named for a credential (a sink's
    ``password_env`` or ``credentials_env``), read when it is used, never kept here."""
    return os.environ.get(name) or None
