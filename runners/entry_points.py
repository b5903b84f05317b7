"""Code only from installed packages: jobs and state migrations are Python entry points.

A package that ships a streaming job or a state-migration function declares it in its
metadata (``pyproject.toml``)::

    [project.entry-points."epochal.jobs"]
    clickstream = "runners.jobs.clickstream:job"

    [project.entry-points."epochal.state_migrations"]
    rename-total = "mypackage.migrations:rename_total"

Everything else (versions, the engine's ``--job``, migrate's ``function``) names one by its
entry-point *name*; nothing takes a ``module:attr`` string. So the code a run can execute is
exactly the code an administrator installed. Plain Python, no Django.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Final

from snapshots_store.patterns import whole_match

JOBS: Final = "epochal.jobs"
STATE_MIGRATIONS: Final = "epochal.state_migrations"
GROUPS: Final = (JOBS, STATE_MIGRATIONS)
NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
_NAME = re.compile(NAME_PATTERN)
_WHAT: Final = {JOBS: "job", STATE_MIGRATIONS: "state migration"}


class EntryPointError(LookupError):
    """A name that is not (exactly one) registered entry point; the message says what to do."""


@dataclass(frozen=True)
class Registered:
    """One registered entry point: its name, what it points at and the package declaring it."""

    group: str
    name: str
    value: str
    distribution: str
    version: str

    def to_dict(self) -> dict[str, str]:
        return {
            "name": self.name,
            "value": self.value,
            "distribution": self.distribution,
            "version": self.version,
        }


def _entries(group: str) -> list[EntryPoint]:
    if group not in GROUPS:
        raise ValueError(f"unknown entry-point group {group!r}; one of {GROUPS}")
    return list(entry_points(group=group))


def _registered(group: str, ep: EntryPoint) -> Registered:
    dist = ep.dist
    return Registered(
        group=group,
        name=ep.name,
        value=ep.value,
        distribution="" if dist is None else str(dist.metadata["Name"]),
        version="" if dist is None else str(dist.version),
    )


def registered(group: str) -> list[Registered]:
    """Every entry point of `group` installed in this environment, by name."""
    found = {(e.name, e.value): _registered(group, e) for e in _entries(group)}
    return sorted(found.values(), key=lambda r: (r.name, r.distribution))


def check_name(group: str, name: object) -> str:
    """`name` when it is a well-formed entry-point name (no I/O, no lookup)."""
    what = _WHAT[group]
    if not isinstance(name, str) or whole_match(_NAME, name) is None:
        hint = " (a module:attr reference is not accepted)" if ":" in str(name) else ""
        raise EntryPointError(
            f"{what} {name!r} is not an entry-point name{hint}: names match "
            f"[A-Za-z0-9][A-Za-z0-9._-]{{0,99}}; see the registered ones in group {group}"
        )
    return name


def lookup(group: str, name: object) -> Registered:
    """The one entry point `name` of `group`; EntryPointError naming the choices otherwise."""
    check_name(group, name)
    matches = {(e.value, id(e.dist)): e for e in _entries(group) if e.name == name}
    if not matches:
        names = sorted({r.name for r in registered(group)})
        raise EntryPointError(
            f"no {_WHAT[group]} named {name!r} is installed (entry-point group {group}); "
            f"registered: {names or 'none'}. A package registers one under "
            f'[project.entry-points."{group}"] in its pyproject.toml'
        )
    values = sorted({e.value for e in matches.values()})
    if len(values) > 1:
        raise EntryPointError(
            f"{_WHAT[group]} {name!r} is registered by more than one installed package "
            f"({values}); uninstall one of them"
        )
    return _registered(group, next(iter(matches.values())))


def lookup_error(group: str, name: object) -> str:
    """Why `name` is not a usable entry point of `group` ("" when it is one)."""
    try:
        lookup(group, name)
    except EntryPointError as exc:
        return str(exc)
    return ""


def load(group: str, name: object) -> Any:
    """The object entry point `name` of `group` points at (imports its module)."""
    found = lookup(group, name)
    for ep in _entries(group):
        if ep.name == found.name and ep.value == found.value:
            try:
                return ep.load()
            except (ImportError, AttributeError) as exc:
                raise EntryPointError(
                    f"{_WHAT[group]} {found.name!r} ({found.value}, from package "
                    f"{found.distribution or '?'}) cannot be loaded: {exc}"
                ) from None
    raise EntryPointError(f"{_WHAT[group]} {found.name!r} disappeared while loading")
