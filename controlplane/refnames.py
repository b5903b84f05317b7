"""Branch and tag names where they enter the control plane (query parameters, operation
payloads, the CLI): checked before anything reaches a store, refused with a 400 naming the
field. The rules (`snapshots_store.names`) are a strict subset of git's check-ref-format."""

from __future__ import annotations

from controlplane.errors import InvalidRequest
from snapshots_store.errors import InvalidNameError
from snapshots_store.names import check_branch_name

REF_PATTERN = (
    r"^(?=.{1,255}$)(?!.*\.\.)(?!.*\.lock(/|$))(?!.*\.$)"
    r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}(/[A-Za-z0-9][A-Za-z0-9._-]{0,99})*$"
)
"""Branch, tag and revision names as a regular expression (for schemas): the same rules."""

REVISION_PATTERN = (
    r"^(?=.{1,300}$)(?!.*\.\.)"
    r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}(/[A-Za-z0-9][A-Za-z0-9._-]{0,99})*([~^][0-9]{0,9})*$"
)
"""A revision (`Repository.resolve`): a snapshot id or prefix, a branch or tag (``tags/x``
too), followed by any ``~n`` / ``^n`` (n-th first parent, n-th parent)."""


def checked_branch(value: object, *, field: str = "branch", what: str = "branch") -> str:
    """`value` when it is a valid branch (or tag) name; InvalidRequest naming `field`."""
    try:
        return check_branch_name(value, what=what)  # type: ignore[arg-type]
    except InvalidNameError as exc:
        raise InvalidRequest(
            f"{field}: {exc.reason} (got {str(value)[:100]!r})", fields={field: [exc.reason]}
        ) from None
