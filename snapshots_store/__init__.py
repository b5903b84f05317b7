"""Epochal's snapshot store: content-addressed objects, refs moved by CAS, reflog, history.

See docs/store-format.md for the format and the contract; `Repository` is the entry point.
"""

from snapshots_store.backends import Backend, PrefixedBackend, open_backend
from snapshots_store.diff import KeyGroupChange, OffsetChange, SnapshotDiff
from snapshots_store.errors import (
    BranchConflictError,
    ControlConflictError,
    CorruptObjectError,
    InvalidNameError,
    MalformedManifestError,
    ObjectNotFoundError,
    RefConflictError,
    RefNotFoundError,
    StoreConfigError,
    StoreError,
    StoreFullError,
    StoreUnavailableError,
    UnknownRevisionError,
)
from snapshots_store.fsck import (
    FsckProblem,
    FsckReport,
    check_repository,
    check_snapshot,
    newest_intact_ancestor,
    newest_intact_on_branch,
)
from snapshots_store.gc import GcItem, GcReport, collect_garbage
from snapshots_store.manifest import Manifest
from snapshots_store.reflog import ReflogEntry
from snapshots_store.refs import RefValue
from snapshots_store.repository import Repository

__all__ = [
    "Backend",
    "BranchConflictError",
    "ControlConflictError",
    "CorruptObjectError",
    "FsckProblem",
    "FsckReport",
    "GcItem",
    "GcReport",
    "InvalidNameError",
    "KeyGroupChange",
    "MalformedManifestError",
    "Manifest",
    "ObjectNotFoundError",
    "OffsetChange",
    "PrefixedBackend",
    "RefConflictError",
    "RefNotFoundError",
    "RefValue",
    "ReflogEntry",
    "Repository",
    "SnapshotDiff",
    "StoreConfigError",
    "StoreError",
    "StoreFullError",
    "StoreUnavailableError",
    "UnknownRevisionError",
    "check_repository",
    "check_snapshot",
    "collect_garbage",
    "newest_intact_ancestor",
    "newest_intact_on_branch",
    "open_backend",
]
