"""Deployment guards: the server does not start on settings that are unsafe in production.

The WSGI entry point (`controlplane.wsgi`, loaded by each of granian's worker processes, and by
`runserver`) refuses to load without a secret key outside debug, so the server exits;
`manage.py check --deploy` reports the same as an error, and warns when login lockouts and
throttles would be kept per process. Commands that serve nothing (`epochal`, `manage.py
jobs`, …) need no secret key.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from controlplane import config


def secret_key_missing() -> bool:
    try:
        return not settings.SECRET_KEY
    except ImproperlyConfigured:  # Django refuses to read an empty SECRET_KEY
        return True


def refuse_unsafe_start() -> None:
    """Raise `ImproperlyConfigured` with what to do when the server must not start."""
    if secret_key_missing():
        raise ImproperlyConfigured(config.SECRET_KEY_MISSING)


@checks.register(checks.Tags.security, deploy=True)
def check_secret_key(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if not secret_key_missing():
        return []
    return [checks.Error(config.SECRET_KEY_MISSING, id="epochal.E001")]


@checks.register(checks.Tags.security, deploy=True)
def check_shared_cache(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    backend = settings.CACHES["default"]["BACKEND"]
    if settings.DEBUG or not backend.endswith("LocMemCache"):
        return []
    return [
        checks.Warning(
            "CACHE_URL is not set: login lockouts and API throttles are counted per process, "
            "so each web worker and replica allows its own share of attempts.",
            hint="Set CACHE_URL=redis://host:6379/2 (the Helm chart sets cache.url).",
            id="epochal.W001",
        )
    ]
