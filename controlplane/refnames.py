"""Branch and tag names where they enter the control plane (query parameters, operation
payloads, the CLI): checked before anything reaches a store, refused with a 400 naming the
field. The rules (`snapshots_store.names`) are a strict subset of git's check-ref-format."""

from __future__ import annotations

from controlplane.errors import InvalidRequest
from snapshots_store.errors import InvalidNameError
from snapshots_store.names import check_branch_name


def checked_branch(value: object, *, field: str = "branch", what: str = "branch") -> str:
    """`value` when it is a valid branch (or tag) name; InvalidRequest naming `field`."""
    try:
        return check_branch_name(value, what=what)  # type: ignore[arg-type]
    except InvalidNameError as exc:
        raise InvalidRequest(
            f"{field}: {exc.reason} (got {str(value)[:100]!r})", fields={field: [exc.reason]}
        ) from None
