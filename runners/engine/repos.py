"""The repositories a process has open, one per (store URL, namespace): a Spark worker's
tasks and a branch output source reuse the same `Repository` (and its manifest cache)
instead of opening the store again for each task."""

from __future__ import annotations

import threading
from collections.abc import Callable

from snapshots_store import Repository

_open: dict[tuple[str, str], Repository] = {}
_lock = threading.Lock()


def repository(
    url: str, namespace: str, opener: Callable[[], Repository] | None = None
) -> Repository:
    """The process's repository for `namespace` in the store at `url`, opened the first
    time by `opener` (default ``Repository.open(url, namespace)``; the control plane passes
    one that adds the store's credentials)."""
    key = (url, namespace)
    with _lock:
        repo = _open.get(key)
    if repo is None:
        repo = Repository.open(url, namespace) if opener is None else opener()
        with _lock:
            repo = _open.setdefault(key, repo)
    return repo
