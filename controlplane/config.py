"""Configuration from environment variables, with embedded defaults (12-factor).

The defaults need no server: SQLite and a filesystem broker under `var/`, a local filesystem
store and Spark `local[2]`. Production sets DATABASE_URL, CELERY_BROKER_URL and STORE_URL.
"""

from __future__ import annotations

import os
from pathlib import Path

from snapshots_store.backends import local_store_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("EPOCHAL_VAR_DIR", BASE_DIR / "var")).resolve()


def secret_from_environment(name: str) -> str:
    """The value of the environment variable an admin's registration names (a store's
    credentials), read when it is used so that a rotated secret needs no restart; "" unset.
    The one read of the environment outside the settings."""
    return os.environ.get(name, "")


def env(name: str, default: str) -> str:
    value = os.environ.get(name, "").strip()
    return value or default


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in {"1", "true", "yes", "on"}:
        return True
    if raw in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean: use true or false")


DEVELOPMENT_SECRET_KEY = "epochal-insecure-development-key-change-me"
SECRET_KEY_MISSING = (
    "DJANGO_SECRET_KEY is not set and DJANGO_DEBUG is off: the server will not start with a "
    "key anyone can read. Set DJANGO_SECRET_KEY to a long random value (e.g. the output of "
    "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`), or set DJANGO_DEBUG=true "
    "for local development only."
)


SECRET_KEY_MIN_LENGTH = 50
"""What Django's own deployment check asks for (security.W009), enforced at start-up."""


def secret_key_too_short(length: int) -> str:
    return (
        f"DJANGO_SECRET_KEY is {length} characters long; the server will not start with fewer "
        f"than {SECRET_KEY_MIN_LENGTH} (and at least 5 different characters): anyone could "
        "guess it and sign sessions. Set it to a long random value (e.g. the output of "
        "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`; the Helm chart "
        "generates one)."
    )


def env_int(name: str, default: int) -> int:
    raw = env(name, str(default))
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def secret_key(*, debug: bool) -> str:
    """DJANGO_SECRET_KEY; the committed development key only in debug, else "" (which Django
    refuses to use, and which `controlplane.deployment` reports before the server starts)."""
    value = env("DJANGO_SECRET_KEY", "")
    if value and (debug or value != DEVELOPMENT_SECRET_KEY):
        return value
    return DEVELOPMENT_SECRET_KEY if debug else ""


def trusted_proxies() -> tuple[str, ...]:
    """EPOCHAL_TRUSTED_PROXIES: the addresses or networks (comma-separated) of the proxies
    whose X-Forwarded-For is believed; checked here so that a typo stops the start."""
    import ipaddress

    entries = tuple(p.strip() for p in env("EPOCHAL_TRUSTED_PROXIES", "").split(",") if p.strip())
    for entry in entries:
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ValueError(
                f"EPOCHAL_TRUSTED_PROXIES: {entry!r} is not an address or network "
                "(e.g. 10.0.0.0/8, 192.168.1.7)"
            ) from None
    return entries


def cache_url() -> str:
    """CACHE_URL: `redis://…` shares login lockouts and throttles between processes and
    replicas; the default `locmem://` keeps them per process (one-process deployments)."""
    value = env("CACHE_URL", "locmem://")
    if not value.startswith(("redis://", "rediss://", "unix://", "locmem://")):
        raise ValueError(f"CACHE_URL={value!r} is not supported: use redis://… or locmem://")
    return value


def cache_backend(url: str) -> dict[str, object]:
    """Django's CACHES entry for `url`."""
    if url.startswith("locmem://"):
        return {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "epochal"}
    return {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": url,
        "KEY_PREFIX": "epochal",
        "TIMEOUT": 3600,
    }


def database_url() -> str:
    return env("DATABASE_URL", f"sqlite:///{VAR_DIR / 'epochal.sqlite3'}")


def broker_url() -> str:
    return env("CELERY_BROKER_URL", "filesystem://")


def broker_timeout_s() -> float:
    """Seconds a send to the broker, or a connection to it, may take (EPOCHAL_BROKER_TIMEOUT_S)."""
    return float(env("EPOCHAL_BROKER_TIMEOUT_S", "5"))


def redis_broker_options(timeout_s: float) -> dict[str, float]:
    """kombu's Redis transport options: socket timeouts, so a broker that holds connections
    without answering (paused, hung, behind a partition that drops packets) fails a send after
    `timeout_s` instead of holding the API request, the reconciler or the beat for ever (kombu
    waits for ever by default)."""
    return {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}


def store_url() -> str:
    return local_store_url(env("STORE_URL", ""), root=BASE_DIR, default=VAR_DIR / "store")


def store_roots(variable: str = "EPOCHAL_STORE_ROOTS") -> tuple[Path, ...]:
    """Directories a registered `file://` store must live under (EPOCHAL_STORE_ROOTS, separated
    by ':'; default the var directory); EPOCHAL_SINK_ROOTS: the same for the directories of
    registered sinks (Delta tables)."""
    raw = env(variable, str(VAR_DIR))
    roots = []
    for part in raw.split(os.pathsep):
        if not part.strip():
            continue
        path = Path(part.strip())
        if not path.is_absolute():
            raise ValueError(f"{variable}: {part!r} is not an absolute directory")
        roots.append(path.resolve())
    return tuple(roots)


def sink_hosts() -> tuple[str, ...]:
    """Hosts a registered sink may name (EPOCHAL_SINK_HOSTS, comma-separated; empty: any)."""
    return tuple(h.strip().lower() for h in env("EPOCHAL_SINK_HOSTS", "").split(",") if h.strip())


def runner() -> str:
    from runners.launchers import RUNNERS

    value = env("RUNNER", "local")
    if value not in RUNNERS:
        raise ValueError(f"RUNNER={value!r} is not supported: use {', '.join(RUNNERS)}")
    return value


def spark_master() -> str:
    return env("SPARK_MASTER", "local[2]")
