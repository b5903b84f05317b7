"""The job file: today's jobs as a YAML document a team keeps in git (docs/control-plane.md).

    apiVersion: epochal.io/v1
    kind: JobList
    jobs:
    - name: clicks-main
      application: clicks        # a registered application …
      store: default             # … in this registered store ("" : the deployment's STORE_URL)
      version: 1                 # a registered version of it (an admin's)
      job: clickstream           # the version's registered job: its sources and sinks
      branch: main
      parallelism: 2
      state: running             # running | stopped
      upgrade: fork              # how a new version is rolled out: fork | hotswap
      resources: {}              # the operator's Spark resource settings (at creation)
      autoscaler: null           # or the policy's fields (GET /api/jobs/<name>/autoscaler/)

Everything the file names is registered by an admin (applications, stores, versions with
their registered job and its sources and sinks); the file only picks among them, as an
operator does. `parse` checks a document before anything is read from the database, naming
each wrong field as ``jobs[i].field``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import yaml

from controlplane.applications.models import JOB_NAME_PATTERN, MAX_PARALLELISM_LIMIT, NAME_PATTERN
from controlplane.autoscaler.schema import POLICY_PATCH
from controlplane.errors import InvalidRequest, UnusableRequest
from controlplane.jobs.spark_conf import spark_conf_schema
from controlplane.patterns import SchemaValidator
from controlplane.refnames import REF_PATTERN

API_VERSION: Final = "epochal.io/v1"
KIND: Final = "JobList"
UPGRADES: Final = ("fork", "hotswap")
STATES: Final = ("running", "stopped")
MAX_JOBS: Final = 1000

_NAME: Final = {"type": "string", "pattern": NAME_PATTERN}
JOB_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "name": {**_NAME, "description": "The job's name."},
        "application": {**_NAME, "description": "A registered application."},
        "store": {
            "type": "string",
            "maxLength": 100,
            "description": "The application's registered store ('' : the deployment's).",
        },
        "version": {"type": "integer", "minimum": 1, "description": "A registered version."},
        "job": {
            "type": "string",
            "pattern": JOB_NAME_PATTERN,
            "description": "The version's registered job (its sources and sinks).",
        },
        "branch": {"type": "string", "pattern": REF_PATTERN},
        "parallelism": {"type": "integer", "minimum": 1, "maximum": MAX_PARALLELISM_LIMIT},
        "state": {"type": "string", "enum": list(STATES)},
        "upgrade": {"type": "string", "enum": list(UPGRADES)},
        "resources": spark_conf_schema(),
        "autoscaler": {"oneOf": [{"type": "null"}, POLICY_PATCH]},
    },
    "required": ["name", "application", "version", "branch", "parallelism"],
    "additionalProperties": False,
}
DOCUMENT_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string", "enum": [API_VERSION]},
        "kind": {"type": "string", "enum": [KIND]},
        "jobs": {"type": "array", "items": JOB_SCHEMA, "maxItems": MAX_JOBS},
    },
    "required": ["apiVersion", "kind", "jobs"],
    "additionalProperties": False,
}
_VALIDATOR: Final = SchemaValidator(DOCUMENT_SCHEMA)


def openapi_schema() -> dict[str, Any]:
    """`DOCUMENT_SCHEMA` as OpenAPI 3.0 says it (no null type: a nullable policy)."""
    job = {**JOB_SCHEMA, "properties": dict(JOB_SCHEMA["properties"])}
    job["properties"]["autoscaler"] = {**POLICY_PATCH, "nullable": True}
    jobs = {**DOCUMENT_SCHEMA["properties"]["jobs"], "items": job}
    return {**DOCUMENT_SCHEMA, "properties": {**DOCUMENT_SCHEMA["properties"], "jobs": jobs}}


@dataclass(frozen=True)
class JobEntry:
    """One job as the file describes it."""

    name: str
    application: str
    version: int
    branch: str
    parallelism: int
    store: str | None = None
    job: str | None = None
    state: str | None = None
    upgrade: str = "fork"
    resources: dict[str, str] = field(default_factory=dict)
    autoscaler: dict[str, Any] | None = None
    #: whether the file gives `autoscaler` at all (absent: the policy is not the file's)
    has_autoscaler: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "application": self.application,
            "store": self.store,
            "version": self.version,
            "job": self.job,
            "branch": self.branch,
            "parallelism": self.parallelism,
            "state": self.state,
            "upgrade": self.upgrade,
            "resources": dict(self.resources),
            "autoscaler": self.autoscaler,
        }
        return {k: v for k, v in out.items() if v is not None or k == "autoscaler"}


def _where(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "file"


def parse(document: Any) -> list[JobEntry]:
    """The jobs of a parsed job file; InvalidRequest naming every wrong field otherwise."""
    errors: dict[str, list[str]] = {}
    for problem in _VALIDATOR.iter_errors(document):
        where = _where(problem.absolute_path)
        if problem.validator == "additionalProperties" and isinstance(problem.instance, dict):
            allowed = problem.schema.get("properties", {})
            for name in sorted(set(problem.instance) - set(allowed)):
                errors.setdefault(f"{where}.{name}" if where != "file" else name, []).append(
                    f"unknown field; allowed: {', '.join(allowed)}"
                )
            continue
        if problem.validator == "required":
            missing = str(problem.message).split("'")[1]
            errors.setdefault(f"{where}.{missing}" if where != "file" else missing, []).append(
                "required"
            )
            continue
        errors.setdefault(where, []).append(problem.message[:200])
    if errors:
        raise InvalidRequest(
            "the job file is refused: " + ", ".join(sorted(errors)),
            code="job_file_invalid",
            fields=errors,
        )
    names = [job["name"] for job in document["jobs"]]
    twice = {f"jobs[{i}].name": [f"job {n!r} is in the file twice"] for i, n in enumerate(names)
             if names.index(n) != i}  # fmt: skip
    if twice:  # well-formed (a schema cannot say it), but which of the two is meant?
        raise UnusableRequest(
            "the job file names a job twice: " + ", ".join(sorted(twice)),
            code="job_file_unusable",
            fields=twice,
        )
    return [
        JobEntry(
            **{k: v for k, v in job.items() if k != "resources"},
            resources=dict(job.get("resources") or {}),
            has_autoscaler="autoscaler" in job,
        )
        for job in document["jobs"]
    ]


def load(text: str) -> Any:
    """The YAML (or JSON) text of a job file, parsed; InvalidRequest when it is not YAML."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidRequest(
            f"the job file is not YAML: {exc}",
            code="job_file_invalid",
            fields={"file": ["not YAML"]},
        ) from None


def dump(entries: list[JobEntry]) -> str:
    """The job file of `entries` (what `epochal export` prints)."""
    document = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "jobs": [entry.to_dict() for entry in entries],
    }
    return yaml.safe_dump(document, sort_keys=False)
