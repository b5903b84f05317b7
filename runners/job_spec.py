"""What to run: the values a launcher needs to start one run of a streaming job.

A `JobSpec` is plain data (frozen, JSON round-trip via `to_dict`/`from_dict`) so the control
plane can write it to its database before acting, and a launcher started again with the same
spec (same `run_id`) finds the run it already created instead of starting a second one.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from runners import entry_points
from snapshots_store.errors import InvalidNameError
from snapshots_store.names import check_branch_name, check_namespace
from snapshots_store.patterns import whole_match

ENGINE_MODULE: Final = "runners.engine.main"
"""The job entry point every launcher runs (`python -m runners.engine.main …`)."""

#: an environment variable name (a store's credentials prefix); the store registry uses it too
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,99}$"
_CREDENTIALS_ENV = re.compile(ENV_NAME_PATTERN)
#: a Kubernetes Secret's name (a DNS subdomain); the store and sink registries use it too
SECRET_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
_SECRET_NAME = re.compile(SECRET_NAME_PATTERN)
_RUN_ID = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")
_MEMORY_OVERHEAD_MIN_MB: Final = 384


class JobSpecError(ValueError):
    """A job specification that cannot be launched; the message names the field."""


def new_run_id() -> str:
    """A fresh run id: 12 lowercase hex digits, usable inside Kubernetes names."""
    return uuid.uuid4().hex[:12]


def memory_with_overhead_mb(memory_mb: int) -> int:
    """JVM heap plus Spark's default non-heap overhead (10 %, at least 384 MiB)."""
    return memory_mb + max(_MEMORY_OVERHEAD_MIN_MB, math.ceil(memory_mb * 0.10))


@dataclass(frozen=True, kw_only=True)
class Resources:
    """Driver and executor sizes. `executors=None` derives the count from the parallelism.
    `standby` keeps a second, warm driver ready to take over from a failed run (the local
    launcher; docs/launchers.md)."""

    driver_cores: int = 1
    driver_memory_mb: int = 1024
    executor_cores: int = 1
    executor_memory_mb: int = 2048
    executors: int | None = None
    standby: bool = False

    def __post_init__(self) -> None:
        for name in ("driver_cores", "driver_memory_mb", "executor_cores", "executor_memory_mb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise JobSpecError(f"resources.{name} must be a positive integer, got {value!r}")
        if self.executors is not None and (
            isinstance(self.executors, bool)
            or not isinstance(self.executors, int)
            or self.executors < 1
        ):
            raise JobSpecError(
                f"resources.executors must be a positive integer or None, got {self.executors!r}"
            )
        if not isinstance(self.standby, bool):
            raise JobSpecError(f"resources.standby must be true or false, got {self.standby!r}")

    def executor_count(self, parallelism: int) -> int:
        """Executors needed so that every one of `parallelism` tasks has a core."""
        if self.executors is not None:
            return self.executors
        return max(1, math.ceil(parallelism / self.executor_cores))


@dataclass(frozen=True, kw_only=True)
class Toleration:
    """A Kubernetes toleration for the driver and executor Pods."""

    key: str | None = None
    operator: str = "Equal"
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None

    def __post_init__(self) -> None:
        if self.operator not in {"Equal", "Exists"}:
            raise JobSpecError(
                f"toleration operator must be Equal or Exists, got {self.operator!r}"
            )
        if self.effect not in {None, "NoSchedule", "PreferNoSchedule", "NoExecute"}:
            raise JobSpecError(
                f"toleration effect must be NoSchedule, PreferNoSchedule or NoExecute, "
                f"got {self.effect!r}"
            )

    def to_kubernetes(self) -> dict[str, Any]:
        """The toleration as it appears in a Pod spec (camelCase, no empty fields)."""
        out: dict[str, Any] = {"operator": self.operator}
        if self.key is not None:
            out["key"] = self.key
        if self.value is not None:
            out["value"] = self.value
        if self.effect is not None:
            out["effect"] = self.effect
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """One run of a streaming job: which code, on which branch of which store, how big.

    `namespace` is the application's namespace in the store (the engine's `--namespace`);
    the Kubernetes namespace belongs to the launcher's configuration. `image` and
    `service_account` default to the launcher's configuration when None, so switching
    `RUNNER` needs no change to the spec. `follow` keeps the job running when its source has
    no new data (a long-running service polling for more) instead of exiting.
    """

    application: str
    namespace: str
    branch: str
    store_url: str
    job: str
    parallelism: int
    max_epochs: int | None = None
    follow: bool = False
    job_args: Mapping[str, Any] = field(default_factory=dict)
    resources: Resources = field(default_factory=Resources)
    image: str | None = None
    service_account: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    image_pull_secrets: tuple[str, ...] = ()
    store_credentials_secret: str | None = None
    #: prefix of the environment variables holding the store's credentials
    #: (`<prefix>_AWS_ACCESS_KEY_ID`, ...); a local launcher hands them to the job as `AWS_*`
    store_credentials_env: str | None = None
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    #: the registered sinks the version names, resolved: ``{"name", "kind", "config"}`` each
    #: (credentials only by environment variable name)
    sinks: tuple[Mapping[str, Any], ...] = ()
    #: sink name -> the environment variable its credentials come from (the job reads it)
    sink_credentials_env: Mapping[str, str] = field(default_factory=dict)
    #: sink name -> the Kubernetes Secret holding that variable, mounted into the job's pods
    sink_secrets: Mapping[str, str] = field(default_factory=dict)
    run_id: str = field(default_factory=new_run_id)

    def __post_init__(self) -> None:
        if not self.application.strip():
            raise JobSpecError("application must not be empty")
        try:
            check_namespace(self.namespace)
            check_branch_name(self.branch)
        except InvalidNameError as exc:
            raise JobSpecError(str(exc)) from None
        if not self.store_url.strip():
            raise JobSpecError("store_url must not be empty (e.g. file:///data/store or s3://…)")
        try:
            entry_points.check_name(entry_points.JOBS, self.job)
        except entry_points.EntryPointError as exc:
            raise JobSpecError(str(exc)) from None
        if isinstance(self.parallelism, bool) or self.parallelism < 1:
            raise JobSpecError(f"parallelism must be at least 1, got {self.parallelism!r}")
        if self.max_epochs is not None and self.max_epochs < 1:
            raise JobSpecError(f"max_epochs must be at least 1 or None, got {self.max_epochs!r}")
        if self.store_credentials_env is not None and not whole_match(
            _CREDENTIALS_ENV, self.store_credentials_env
        ):
            raise JobSpecError(
                "store_credentials_env must be an environment variable prefix (upper-case "
                f"letters, digits, '_'), got {self.store_credentials_env!r}"
            )
        if not isinstance(self.follow, bool):
            raise JobSpecError(f"follow must be true or false, got {self.follow!r}")
        if whole_match(_RUN_ID, self.run_id) is None:
            raise JobSpecError(
                f"run_id must be 1-32 lowercase letters, digits or '-', got {self.run_id!r}"
            )
        bad = [key for key in self.spark_conf if not key.startswith("spark.")]
        if bad:
            raise JobSpecError(f"spark_conf keys must start with 'spark.', got {sorted(bad)}")
        if any(not isinstance(v, str) for v in self.spark_conf.values()):
            raise JobSpecError("spark_conf values must be strings")
        if not isinstance(self.job_args, Mapping) or not all(
            isinstance(k, str) for k in self.job_args
        ):
            raise JobSpecError("job_args must be an object with string keys")
        try:
            json.dumps(dict(self.job_args))
        except (TypeError, ValueError) as exc:
            raise JobSpecError(f"job_args must be plain JSON: {exc}") from None
        object.__setattr__(self, "job_args", dict(self.job_args))
        if not isinstance(self.sinks, list | tuple) or not all(
            isinstance(d, Mapping) and set(d) == {"name", "kind", "config"} for d in self.sinks
        ):
            raise JobSpecError("sinks must be a list of {name, kind, config} objects")
        object.__setattr__(self, "sinks", tuple(dict(d) for d in self.sinks))
        self._check_sink_credentials()
        object.__setattr__(self, "node_selector", dict(self.node_selector))
        object.__setattr__(self, "spark_conf", dict(self.spark_conf))
        object.__setattr__(self, "tolerations", tuple(self.tolerations))
        object.__setattr__(self, "image_pull_secrets", tuple(self.image_pull_secrets))

    def _check_sink_credentials(self) -> None:
        names = {d["name"] for d in self.sinks}
        for what, values, pattern in (
            ("sink_credentials_env", self.sink_credentials_env, _CREDENTIALS_ENV),
            ("sink_secrets", self.sink_secrets, _SECRET_NAME),
        ):
            if not isinstance(values, Mapping):
                raise JobSpecError(f"{what} must be an object (sink name -> name)")
            for sink, value in values.items():
                if sink not in names:
                    raise JobSpecError(f"{what} names sink {sink!r}, which the job does not write")
                if not isinstance(value, str) or whole_match(pattern, value) is None:
                    raise JobSpecError(f"{what}[{sink!r}] is not a valid name: {value!r}")
            object.__setattr__(self, what, dict(values))

    def engine_arguments(self) -> list[str]:
        """Arguments of `python -m runners.engine.main` for this run."""
        args = [
            "--job",
            self.job,
            "--store",
            self.store_url,
            "--namespace",
            self.namespace,
            "--branch",
            self.branch,
            "--parallelism",
            str(self.parallelism),
        ]
        if self.max_epochs is not None:
            args += ["--max-epochs", str(self.max_epochs)]
        if self.follow:
            args.append("--follow")
        if self.job_args:
            args += ["--job-args", json.dumps(dict(self.job_args), sort_keys=True)]
        if self.sinks:
            args += ["--sinks", json.dumps(list(self.sinks), sort_keys=True)]
        return args

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; `JobSpec.from_dict(spec.to_dict()) == spec`."""
        data = asdict(self)
        data["tolerations"] = [asdict(t) for t in self.tolerations]
        data["image_pull_secrets"] = list(self.image_pull_secrets)
        data["sinks"] = [dict(d) for d in self.sinks]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        values = dict(data)
        unknown = set(values) - {f for f in cls.__dataclass_fields__}
        if unknown:
            raise JobSpecError(f"unknown job spec fields: {sorted(unknown)}")
        if "resources" in values:
            values["resources"] = Resources(**values["resources"])
        if "tolerations" in values:
            values["tolerations"] = tuple(Toleration(**t) for t in values["tolerations"])
        if "image_pull_secrets" in values:
            values["image_pull_secrets"] = tuple(values["image_pull_secrets"])
        return cls(**values)
