"""Branch and tag names where they enter the control plane (query parameters, operation
payloads, the CLI): checked before anything reaches a store, refused with a 400 naming the
field. The rules (`snapshots_store.names`) are a strict subset of git's check-ref-format."""

from __future__ import annotations

from controlplane.errors import InvalidRequest
from snapshots_store.errors import InvalidNameError, InvalidRevisionError
from snapshots_store.names import check_branch_name
from snapshots_store.revisions import REVISION_PATTERN as PUBLISHED_REVISION_PATTERN
from snapshots_store.revisions import parse_revision

REF_PATTERN = (
    r"^(?=.{1,255}$)(?!.*\.\.)(?!.*\.lock(/|$))(?!.*\.$)"
    r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}(/[A-Za-z0-9][A-Za-z0-9._-]{0,99})*$"
)
"""Branch, tag and revision names as a regular expression (for schemas): the same rules."""

REVISION_PATTERN = PUBLISHED_REVISION_PATTERN
"""A revision's shape for published schemas (`snapshots_store.revisions`); validators parse."""


def checked_branch(value: object, *, field: str = "branch", what: str = "branch") -> str:
    """`value` when it is a valid branch (or tag) name; InvalidRequest naming `field`."""
    try:
        return check_branch_name(value, what=what)  # type: ignore[arg-type]
    except InvalidNameError as exc:
        raise InvalidRequest(
            f"{field}: {exc.reason} (got {str(value)[:100]!r})", fields={field: [exc.reason]}
        ) from None


def _refuse_empty(value: str | None, field: str) -> None:
    """A parameter given empty (``?rev=``) is refused, not taken for its default."""
    if value == "":
        raise InvalidRequest(
            f"{field}: empty; leave the parameter out for the default",
            fields={field: ["must not be empty"]},
        )


def checked_ref(value: str | None, *, field: str) -> str | None:
    """`value` when it is None (not given) or a branch, tag or snapshot id by the name rules
    (`REF_PATTERN`: ``main``, ``heads/x``, ``tags/y``, 64 hex digits); InvalidRequest naming
    `field` otherwise, an empty one included."""
    _refuse_empty(value, field)
    return None if value is None else checked_branch(value, field=field, what="revision")


def checked_revision(value: str | None, *, field: str) -> str | None:
    """`value` when it is None (not given) or a revision (`snapshots_store.revisions`, the
    whole string); InvalidRequest naming `field` otherwise — an empty one too — before any
    store is asked to resolve it."""
    _refuse_empty(value, field)
    if value is not None:
        try:
            parse_revision(value)
        except InvalidRevisionError as exc:
            raise InvalidRequest(f"{field}: {exc}", fields={field: ["not a revision"]}) from None
    return value
