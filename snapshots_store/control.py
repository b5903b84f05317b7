"""Control documents: the desired state of a running job (parallelism, pause, stop-at-epoch).

One JSON document per branch at ``control/<branch>``, written only by compare-and-swap on
an opaque version token. The stored form wraps the caller's document with a generation
counter, so a document that returns to an earlier content still gets a new version.
"""

from __future__ import annotations

import json
from typing import Any, Final

from snapshots_store.backends.base import Backend
from snapshots_store.codec import canonical_json
from snapshots_store.errors import ControlConflictError, InvalidNameError, StoreError
from snapshots_store.names import check_branch_name

CONTROL_PREFIX: Final = "control/"
_ATTEMPTS: Final = 5


def control_key(branch: str) -> str:
    return CONTROL_PREFIX + check_branch_name(branch)


class ControlStore:
    """Control documents of one namespace."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def _read(self, branch: str) -> tuple[dict[str, Any], int, str | None]:
        blob = self.backend.get(control_key(branch))
        if blob is None:
            return {}, 0, None
        try:
            stored = json.loads(blob.data)
        except ValueError:
            stored = None
        if not (
            isinstance(stored, dict)
            and set(stored) == {"generation", "doc"}
            and isinstance(stored["generation"], int)
            and isinstance(stored["doc"], dict)
        ):
            raise StoreError(
                f"control document of branch {branch} is malformed; rewrite it with "
                f"write_control(expected_version=<its current version>)"
            )
        return stored["doc"], stored["generation"], blob.version

    def read(self, branch: str) -> tuple[dict[str, Any], str | None]:
        """(document, version); ({}, None) when the branch has no control document yet."""
        doc, _, version = self._read(branch)
        return doc, version

    def write(self, branch: str, doc: dict[str, Any], expected_version: str | None) -> str:
        """Replace the document if its version is still `expected_version` (None = absent)."""
        check_branch_name(branch)
        if not isinstance(doc, dict) or not all(isinstance(k, str) for k in doc):
            raise InvalidNameError(
                control_key(branch), "the control document must be a JSON object (a dict)"
            )
        try:
            canonical_json(doc)
        except (TypeError, ValueError) as exc:
            raise InvalidNameError(
                control_key(branch), f"the control document must be plain JSON ({exc})"
            ) from None
        _, generation, version = self._read(branch)
        if version != expected_version:
            raise ControlConflictError(branch, expected_version, version)
        data = canonical_json({"generation": generation + 1, "doc": doc})
        key = control_key(branch)
        for _ in range(_ATTEMPTS):
            if version is None:
                new_version = self.backend.put_if_absent(key, data)
            else:
                new_version = self.backend.put_if_match(key, data, version)
            if new_version is not None:
                return new_version
            blob = self.backend.get(key)
            if blob is not None and blob.data == data:
                return blob.version  # our own write, acknowledged late (a retry)
            current = None if blob is None else blob.version
            if current != version:
                raise ControlConflictError(branch, expected_version, current)
            # unchanged: the server refused spuriously (e.g. S3 409); try again
        raise ControlConflictError(branch, expected_version, version)
