"""The sink registry: the destinations a version may send its output to, registered by admins.

An operator never gives a URL, a path or credentials: a version's config names registered
sinks (``"sinks": ["name", …]``) and the job spec carries each one's kind and config to the
engine, with its credentials' environment variable name only. A sink's config is checked by
its destination (runners/engine/destinations: the field it names), then against the places
this deployment allows: a Delta table's directory under EPOCHAL_SINK_ROOTS, a host in
EPOCHAL_SINK_HOSTS (when set).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from controlplane.applications.models import Sink
from controlplane.applications.sink_config import resolved_config, sink_config_errors
from controlplane.errors import InvalidRequest


class UnknownSinkError(LookupError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"no sink named {name!r} is registered; an admin registers one (admin site, "
            "Sinks); GET /api/sinks/ lists them"
        )


def sink_get(*, name: str) -> Sink:
    sink = Sink.objects.filter(name=name).first()
    if sink is None:
        raise UnknownSinkError(name)
    return sink


def sink_list() -> list[Sink]:
    return list(Sink.objects.order_by("name"))


def version_sink_errors(names: Any) -> list[str]:
    """What is wrong with a version config's ``sinks`` (a list of registered sink names)."""
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return ["sinks must be a list of registered sink names"]
    if len(set(names)) != len(names):
        return ["sinks names a sink twice"]
    known = set(Sink.objects.filter(name__in=names).values_list("name", flat=True))
    return [str(UnknownSinkError(n)) for n in names if n not in known]


def sink_spec_fields(names: Sequence[str]) -> dict[str, Any]:
    """The job spec's fields for the sinks `names`: ``sinks`` (each registered sink's name,
    kind and config, credentials by variable name), ``sink_credentials_env`` and
    ``sink_secrets`` (the Kubernetes Secrets a pod mounts); InvalidRequest naming the sink and
    the field when one cannot be built."""
    errors = version_sink_errors(list(names))
    if errors:
        raise InvalidRequest("; ".join(errors), fields={"sinks": errors}, code="unknown_sink")
    out = []
    credentials_env: dict[str, str] = {}
    secrets: dict[str, str] = {}
    for name in names:
        sink = sink_get(name=name)
        problems = sink_config_errors(sink.name, sink.kind, sink.config, sink.credentials_env)
        if problems:
            message = "; ".join(m for ms in problems.values() for m in ms)
            raise InvalidRequest(
                f"sink {name!r} cannot be used: {message}; an admin fixes its registration",
                fields={"sinks": [message]},
                code="invalid_sink",
            )
        config = resolved_config(sink.name, sink.kind, sink.config, sink.credentials_env)
        out.append({"name": sink.name, "kind": sink.kind, "config": config})
        if sink.credentials_env:
            credentials_env[sink.name] = sink.credentials_env
        if sink.credentials_secret:
            secrets[sink.name] = sink.credentials_secret
    return {"sinks": tuple(out), "sink_credentials_env": credentials_env, "sink_secrets": secrets}


def shared_sink_errors(config: Any, writers: Mapping[str, Sequence[str]]) -> list[str]:
    """The sinks a new branch's version config names that other branches' jobs already write
    (`writers`: sink name -> the jobs whose versions name it): two branches never write one
    destination, so a fork's version names sinks of its own."""
    names = config.get("sinks", []) if isinstance(config, Mapping) else []
    return [
        f"sink {name!r} is written by job {', '.join(writers[name])}; a fork writes where its "
        "version names, never into its parent's: fork with sinks naming registered sinks "
        "nobody writes ([] for none), or an admin registers another sink"
        for name in names
        if isinstance(name, str) and writers.get(name)
    ]


def sink_writers(application: Any) -> dict[str, list[str]]:
    """Sink name -> the jobs of `application` whose versions name it."""
    from controlplane.jobs.models import Job

    out: dict[str, list[str]] = {}
    for job in Job.objects.filter(application=application).select_related("version"):
        config = job.version.config if isinstance(job.version.config, Mapping) else {}
        for name in config.get("sinks", []) or []:
            out.setdefault(str(name), []).append(job.name)
    return out


#: destinations that are logs: what they published stays published (no rollback there)
LOG_KINDS = frozenset({"kafka", "redis_streams", "rabbitmq_streams"})


def log_sinks(config: Any) -> list[str]:
    """The log sinks (``name (kind)``) a version config names: a rollback cannot take back
    what they published."""
    names = config.get("sinks", []) if isinstance(config, Mapping) else []
    rows = Sink.objects.filter(name__in=[n for n in names if isinstance(n, str)])
    return sorted(f"{s.name} ({s.kind})" for s in rows if s.kind in LOG_KINDS)


def rollback_confirmation(config: Any, params: Mapping[str, Any]) -> dict[str, Any]:
    """What a rollback records about the version's log sinks (nothing without any); refuses,
    naming ``confirm_published``, unless the operator confirmed that records they already
    published stay published."""
    logs = log_sinks(config)
    if not logs:
        return {}
    if params.get("confirm_published") is not True:
        message = (
            f"the job writes to the log sink{'s' if len(logs) > 1 else ''} {', '.join(logs)}: "
            "records published after the target stay published (a log cannot take them back; "
            "the Delta and PostgreSQL sinks do go back); pass confirm_published: true"
        )
        raise InvalidRequest(
            message, fields={"confirm_published": [message]}, code="confirm_published"
        )
    return {"confirm_published": True, "published_stay_in": logs}


def sink_register(
    *,
    name: str,
    kind: str,
    config: Mapping[str, Any],
    credentials_env: str = "",
    credentials_secret: str = "",
    description: str = "",
) -> Sink:
    """Register a sink (admins only; the demo registers its Delta table), or find the same
    registration made before; InvalidRequest naming the field, Conflict for a name taken by
    another registration."""
    from django.core.exceptions import ValidationError

    from controlplane.errors import Conflict

    existing = Sink.objects.filter(name=name).first()
    if existing is not None:
        same = (kind, dict(config), credentials_env, credentials_secret)
        if (existing.kind, existing.config, existing.credentials_env,
                existing.credentials_secret) == same:  # fmt: skip
            return existing
        raise Conflict(
            f"a sink named {name!r} is registered already",
            code="sink_exists",
            fields={"name": ["taken"]},
        )
    sink = Sink(
        name=name,
        kind=kind,
        config=dict(config),
        credentials_env=credentials_env,
        credentials_secret=credentials_secret,
        description=description,
    )
    try:
        sink.full_clean()
    except ValidationError as exc:
        raise InvalidRequest(
            "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items()),
            fields=exc.message_dict,
        ) from None
    sink.save()
    return sink
