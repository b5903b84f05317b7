"""Validation of a sink's registered config: the fields a kind knows, their types."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar, Self
from urllib.parse import quote, urlsplit, urlunsplit

from runners import config

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def check_fields(
    kind: str, name: str, config: Any, required: Mapping[str, type | tuple[type, ...]],
    optional: Mapping[str, type | tuple[type, ...]],
) -> dict[str, Any]:  # fmt: skip
    """`config` as a dict, after checking the sink's name, unknown, missing and mistyped fields."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(
            f"{kind} sink name {name!r}: use 1 to 100 letters, digits, '.', '_' or '-' "
            "(it names the sink's ids in the destination)"
        )
    if not isinstance(config, Mapping):
        raise ValueError(f"sink {name!r} ({kind}): config must be an object, not {config!r}")
    known = {**required, **optional}
    unknown = sorted(set(config) - set(known))
    if unknown:
        raise ValueError(
            f"sink {name!r} ({kind}): unknown field(s) {unknown}; known: {sorted(known)}"
        )
    for field in required:
        if field not in config:
            raise ValueError(f"sink {name!r} ({kind}): field {field!r} is required")
    for field, value in config.items():
        want = known[field]
        types = want if isinstance(want, tuple) else (want,)
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            names = " or ".join(t.__name__ for t in types)
            raise ValueError(
                f"sink {name!r} ({kind}): field {field!r} must be {names}, not {value!r}"
            )
    return dict(config)


def check_positive(kind: str, name: str, field: str, value: int, limit: int) -> None:
    if not 1 <= value <= limit:
        raise ValueError(
            f"sink {name!r} ({kind}): field {field!r} must be between 1 and {limit}, not {value}"
        )


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")


def check_password_env(kind: str, name: str, value: str) -> None:
    if value and not ENV_NAME.fullmatch(value):
        raise ValueError(
            f"sink {name!r} ({kind}): field 'password_env' must name an environment variable, "
            f"not {value!r}"
        )


def with_password(url: str, password_env: str, kind: str, name: str) -> str:
    """`url` with the password the environment variable `password_env` holds (read now, never
    kept) in its userinfo; `url` itself when no variable is named. A registered sink's URL
    never holds the password (the registry refuses one): an admin names the variable."""
    if not password_env:
        return url
    password = config.secret(password_env)
    if password is None:
        raise ValueError(
            f"sink {name!r} ({kind}): password_env: {password_env} is not set in the job's "
            "environment; set it where the job runs (a Kubernetes Secret on the sink's "
            "registration: credentials_secret)"
        )
    parts = urlsplit(url)
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"
    return urlunsplit(parts._replace(netloc=netloc))


class FromConfig:
    """`from_config` for a destination class: its `KIND`, `REQUIRED` and `OPTIONAL` fields
    checked (`check_fields`), then the class's own checks of the values (``__post_init__``)."""

    KIND: ClassVar[str]
    REQUIRED: ClassVar[Mapping[str, type | tuple[type, ...]]]
    OPTIONAL: ClassVar[Mapping[str, type | tuple[type, ...]]]

    @classmethod
    def from_config(cls, name: str, config: Mapping[str, Any]) -> Self:
        fields = check_fields(cls.KIND, name, config, cls.REQUIRED, cls.OPTIONAL)
        return cls(**{**fields, "name": name})


__all__ = ["FromConfig", "check_fields", "check_password_env", "check_positive", "with_password"]
