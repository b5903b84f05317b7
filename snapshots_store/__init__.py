"""Epochal's snapshot store: content-addressed objects, refs moved by CAS, reflog, history.

See docs/store-format.md for the format and the contract; `Repository` is the entry point.
"""

from snapshots_store.backends import Backend, open_backend
from snapshots_store.errors import (
    ControlConflictError,
    CorruptObjectError,
    InvalidNameError,
    MalformedManifestError,
    ObjectNotFoundError,
    RefConflictError,
    RefNotFoundError,
    StoreConfigError,
    StoreError,
    UnknownRevisionError,
)
from snapshots_store.manifest import Manifest
from snapshots_store.reflog import ReflogEntry
from snapshots_store.refs import RefValue
from snapshots_store.repository import Repository

__all__ = [
    "Backend",
    "ControlConflictError",
    "CorruptObjectError",
    "InvalidNameError",
    "MalformedManifestError",
    "Manifest",
    "ObjectNotFoundError",
    "RefConflictError",
    "RefNotFoundError",
    "RefValue",
    "ReflogEntry",
    "Repository",
    "StoreConfigError",
    "StoreError",
    "UnknownRevisionError",
    "open_backend",
]
