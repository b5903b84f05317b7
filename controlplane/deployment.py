"""Deployment guards: the server does not start on settings that are unsafe in production.

The WSGI entry point (`controlplane.wsgi`, loaded by each of granian's worker processes, and by
`runserver`) refuses to load without a secret key of at least 50 characters outside debug,
so the server exits;
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


def secret_key_problem() -> str:
    """What is wrong with the secret key for a server outside debug ("" when nothing)."""
    if secret_key_missing():
        return config.SECRET_KEY_MISSING
    key = str(settings.SECRET_KEY)
    if settings.DEBUG:
        return ""
    if len(key) < config.SECRET_KEY_MIN_LENGTH or len(set(key)) < 5:
        return config.secret_key_too_short(len(key))
    return ""


def refuse_unsafe_start() -> None:
    """Raise `ImproperlyConfigured` with what to do when the server must not start."""
    problem = secret_key_problem()
    if problem:
        raise ImproperlyConfigured(problem)


@checks.register(checks.Tags.security, deploy=True)
def check_secret_key(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    problem = secret_key_problem()
    if not problem:
        return []
    return [checks.Error(problem, id="epochal.E001")]


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
