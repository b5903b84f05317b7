"""A registered sink's config, checked: by its destination (runners/engine/destinations: the
field it names) and against the places this deployment allows — a Delta table's directory
under EPOCHAL_SINK_ROOTS, a host in EPOCHAL_SINK_HOSTS (when set). No model here: the Sink
model's clean and the registry (controlplane/applications/sinks.py) both use it."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from runners.engine.destinations import KINDS, build

#: the config field each kind takes its credentials' environment variable in
CREDENTIAL_FIELDS = {
    "delta": "credentials_env",
    "postgres": "password_env",
    "iceberg": "password_env",
    "redis_streams": "password_env",
    "rabbitmq_streams": "password_env",
}
#: config fields naming a local directory (under EPOCHAL_SINK_ROOTS unless a URL)
PATH_FIELDS = ("path", "warehouse")
#: config fields naming a server by URL (its host in EPOCHAL_SINK_HOSTS when that is set)
URL_FIELDS = ("url", "catalog_uri")


def resolved_config(
    sink_name: str, kind: str, config: Mapping[str, Any], credentials_env: str
) -> dict[str, Any]:
    out = dict(config)
    field = CREDENTIAL_FIELDS.get(kind)
    if credentials_env and field:
        out[field] = credentials_env
    return out


def _place_errors(kind: str, config: Mapping[str, Any]) -> list[str]:
    """Where the config points outside the allowed roots and hosts."""
    errors = []
    for field in PATH_FIELDS:
        path = config.get(field)
        if not isinstance(path, str) or "://" in path.removeprefix("file://"):
            continue
        real = Path(os.path.realpath(path.removeprefix("file://")))
        roots: Sequence[Path] = settings.EPOCHAL_SINK_ROOTS
        if not any(real == r or real.is_relative_to(r) for r in roots):
            allowed = ", ".join(str(r) for r in roots) or "none"
            errors.append(
                f"{field}: {real} is outside the sink roots ({allowed}); an admin adds a root "
                "with EPOCHAL_SINK_ROOTS"
            )
    hosts: Sequence[str] = settings.EPOCHAL_SINK_HOSTS
    if hosts:
        named = []
        for field in URL_FIELDS:
            if isinstance(config.get(field), str):
                named.append((field, urlsplit(config[field]).hostname or ""))
        if isinstance(config.get("bootstrap_servers"), str):
            for server in config["bootstrap_servers"].split(","):
                named.append(("bootstrap_servers", server.strip().rpartition(":")[0]))
        options = config.get("storage_options")
        if isinstance(options, Mapping) and isinstance(options.get("AWS_ENDPOINT_URL"), str):
            named.append(("storage_options", urlsplit(options["AWS_ENDPOINT_URL"]).hostname or ""))
        for field, host in named:
            if host.lower() not in hosts:
                errors.append(
                    f"{field}: host {host!r} is not an allowed sink host ({', '.join(hosts)}); "
                    "an admin adds it to EPOCHAL_SINK_HOSTS"
                )
    return errors


def sink_config_errors(
    name: str, kind: str, config: Any, credentials_env: str = ""
) -> dict[str, list[str]]:
    """Field errors of a sink registration (empty when the engine can build it)."""
    if kind not in KINDS:
        return {"kind": [f"{kind!r} is not one of {', '.join(sorted(KINDS))}"]}
    if not isinstance(config, Mapping):
        return {"config": ["must be a JSON object"]}
    field = CREDENTIAL_FIELDS.get(kind)
    if field and field in config:
        return {"config": [f"{field}: set credentials_env instead (admins name the variable)"]}
    if credentials_env and not field:
        return {"credentials_env": [f"a {kind} sink takes its settings from config"]}
    try:
        build(name or "sink", kind, resolved_config(name, kind, config, credentials_env))
    except ValueError as exc:
        return {"config": [str(exc)]}
    places = _password_errors(config) + _place_errors(kind, config)
    return {"config": places} if places else {}


def _password_errors(config: Mapping[str, Any]) -> list[str]:
    """A password in a URL field: a registration names its variable (credentials_env), or the
    password would sit in the database and in every viewer's GET /api/sinks/."""
    return [
        f"{field}: no password in the URL; put it in an environment variable and name that "
        "variable with credentials_env"
        for field in URL_FIELDS
        if isinstance(config.get(field), str) and urlsplit(config[field]).password is not None
    ]
