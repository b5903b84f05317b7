"""A job that cannot go on because of its store stops with a reason, not a traceback.

* The store unavailable past its retry budget (`StoreUnavailableError`), or its filesystem
  full (`StoreFullError`): exit status 4, the reason ``store … unavailable: …`` or ``store …
  full: …``; nothing was committed by the failed epoch, a restart
  resumes from the head.
* The snapshot to restore is damaged (a chunk or manifest whose bytes do not match its hash, or
  missing): exit status 5, the reason names the snapshot, the object and the newest intact
  ancestor to roll back to. Nothing is read wrong: every object is verified as it is read.

Raised in an executor's task, the error reaches the driver inside Spark's own exception, whose
text carries it; `classify` finds it there too.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import re
import sys
from collections.abc import Callable
from typing import Any

from snapshots_store import (
    CorruptObjectError,
    ObjectNotFoundError,
    Repository,
    StoreError,
    StoreUnavailableError,
    check_snapshot,
    newest_intact_on_branch,
)

STORE_UNAVAILABLE_EXIT = 4
DAMAGED_SNAPSHOT_EXIT = 5

_UNAVAILABLE = re.compile(
    r"(?:StoreUnavailableError|StoreFullError): (store \S+ (?:unavailable|full): [^\n]*)"
)
_DAMAGED = re.compile(r"(?:CorruptObjectError|ObjectNotFoundError): ([^\n]*)")


def classify(exc: BaseException) -> tuple[str, str] | None:
    """("unavailable" | "damaged", message) when `exc` is (or wraps) a store fault."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, StoreUnavailableError):
            return "unavailable", str(current)
        if isinstance(current, CorruptObjectError | ObjectNotFoundError):
            return "damaged", str(current)
        text = str(current)
        for kind, pattern in (("unavailable", _UNAVAILABLE), ("damaged", _DAMAGED)):
            found = pattern.search(text)
            if found:
                return kind, found.group(1)
        current = current.__cause__ or current.__context__
    return None


def damaged_reason(repo: Repository, branch: str, message: str) -> str:
    """What is damaged at the head of `branch`, and the snapshot to roll back to."""
    head = repo.read_ref(f"heads/{branch}")
    if head is None:
        return f"store object damaged: {message}"
    problems = check_snapshot(repo, head.target)
    what = "; ".join(p.message for p in problems[:3]) or message
    intact = newest_intact_on_branch(repo, branch)
    if intact is None:
        advice = "no intact earlier snapshot on the branch: restore the store from a backup"
    else:
        epoch = repo.read_manifest(intact).epoch
        advice = f"roll back to the newest intact ancestor {intact} (epoch {epoch})"
    return f"snapshot {head.target} (head of {branch}) cannot be restored: {what}; {advice}"


def stop_on_store_faults(main: Callable[..., int]) -> Callable[..., int]:
    """Wrap the job's entry point: a store fault ends it with a ``stopped`` event."""

    @functools.wraps(main)
    def guarded(argv: list[str] | None = None, **kwargs: Any) -> int:
        try:
            return main(argv, **kwargs)
        except Exception as exc:
            fault = classify(exc)
            if fault is None:
                raise
            kind, message = fault
            code = STORE_UNAVAILABLE_EXIT
            if kind == "damaged":
                code = DAMAGED_SNAPSHOT_EXIT
                with contextlib.suppress(StoreError):
                    message = damaged_reason(*_store_of(argv), message)
            print(json.dumps({"event": "stopped", "reason": message}), flush=True)
            return code

    return guarded


def _store_of(argv: list[str] | None) -> tuple[Repository, str]:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--store", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--branch", default="main")
    args, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    return Repository.open(args.store, args.namespace), args.branch
