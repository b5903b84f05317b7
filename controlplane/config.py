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


def database_url() -> str:
    return env("DATABASE_URL", f"sqlite:///{VAR_DIR / 'epochal.sqlite3'}")


def broker_url() -> str:
    return env("CELERY_BROKER_URL", "filesystem://")


def store_url() -> str:
    return local_store_url(env("STORE_URL", ""), root=BASE_DIR, default=VAR_DIR / "store")


def runner() -> str:
    value = env("RUNNER", "local")
    if value not in {"local", "kubernetes"}:
        raise ValueError(f"RUNNER={value!r} is not supported: use local or kubernetes")
    return value


def spark_master() -> str:
    return env("SPARK_MASTER", "local[2]")
