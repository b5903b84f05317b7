"""Validation of branch, tag, ref and namespace names — pure, before any I/O.

A name part matches ``[A-Za-z0-9][A-Za-z0-9._-]{0,99}``; parts are joined by ``/``; no
``..``, nothing absolute, no part ending in ``.lock``, no trailing ``.``, no NUL. So no name can
address a path outside the store root or collide with a lock or temp file, and every name is
also valid under git's check-ref-format (a strict subset of its rules: no control characters,
spaces, ``~^:?*[`` and backslash, ``@{``, ``//``, leading ``.`` of a part, trailing ``/`` or ``.``).
"""

from __future__ import annotations

import re
from typing import Final

from snapshots_store.errors import InvalidNameError

REFS_PREFIX: Final = "refs/"
REF_KINDS: Final = ("heads", "tags")
_SEGMENT: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_MAX_NAME: Final = 255


def check_branch_name(name: str, *, what: str = "branch") -> str:
    """Validate a branch or tag name (no I/O); InvalidNameError says what is wrong."""
    if not isinstance(name, str) or not name:
        raise InvalidNameError(str(name), f"a {what} name must not be empty")
    if "\0" in name:
        raise InvalidNameError(name, f"a {what} name must not contain a NUL byte")
    if name.startswith("/"):
        raise InvalidNameError(name, f"a {what} name must not be absolute")
    if ".." in name:
        raise InvalidNameError(name, f"a {what} name must not contain '..'")
    if name.endswith("."):
        raise InvalidNameError(name, f"a {what} name must not end with '.'")
    if len(name) > _MAX_NAME:
        raise InvalidNameError(name, f"a {what} name is at most {_MAX_NAME} characters")
    for segment in name.split("/"):
        if not _SEGMENT.fullmatch(segment):
            raise InvalidNameError(
                name,
                f"each '/'-separated part of a {what} name must match "
                f"[A-Za-z0-9][A-Za-z0-9._-]{{0,99}} (got {segment!r})",
            )
        if segment.endswith(".lock"):
            raise InvalidNameError(name, f"no part of a {what} name may end in '.lock'")
    return name


def check_namespace(name: str) -> str:
    """A namespace is one name segment (it becomes a directory / key prefix)."""
    check_branch_name(name, what="namespace")
    if "/" in name:
        raise InvalidNameError(name, "a namespace is a single name without '/'")
    return name


def check_ref_name(name: str) -> str:
    """Validate and normalise a full ref name (``refs/`` prefix optional) to ``heads/x``."""
    if not isinstance(name, str):
        raise InvalidNameError(str(name), "a ref name is a string")
    if name.startswith(REFS_PREFIX):
        name = name[len(REFS_PREFIX) :]
    kind, sep, rest = name.partition("/")
    if kind not in REF_KINDS or not sep:
        raise InvalidNameError(name, "a ref name is heads/<branch> or tags/<tag>")
    try:
        check_branch_name(rest, what="branch" if kind == "heads" else "tag")
    except InvalidNameError as exc:
        raise InvalidNameError(name, exc.reason) from None
    return name
