"""The split routing's exchange through files. In one Spark stage of p tasks, each task maps
its pieces of the input, writes one Arrow IPC file per owning task into the epoch's exchange
directory and publishes the list of what it wrote (`publish`); every task collects all
pieces' lists (`wait_published`; a piece whose task has not started is claimed and mapped by a
waiting task), memory-maps the files sent to it and reduces. PySpark's own shuffle
(`partitionBy`) pickles every blob into the JVM, compresses, spills and reads it back —
measured at ≈ 0.5 CPU-seconds and ≈ 1 s of wall time per 32 MB on two cores, more than reading
the input twice; a file written to and read from the page cache costs a few milliseconds.
Barrier mode is not used: `BarrierTaskContext.allGather` polls once a second, and Spark may
delay a barrier stage's launch by its slot check.

The directory must be reachable from every executor: `$EPOCHAL_EXCHANGE_DIR` (a shared
filesystem on a cluster), or by default, when the Spark master is local, the machine's temporary
directory. Without one the split routing falls back to Spark's shuffle and `auto` does not
pick it. Each epoch attempt uses a fresh subdirectory, removed when its Spark job ends.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from runners import config
from runners.engine.sources import DeadLetter

EXCHANGE_DIR_ENV = config.EXCHANGE_DIR_ENV
#: how long a task waits for a piece another task claimed before mapping it itself (the
#: claimer may have failed: Spark retries a task, never its claims)
CLAIMED_TIMEOUT_S = 60.0


@dataclass
class MapShare:
    """One map task's contribution to one reducer."""

    split_index: int
    payload: bytes
    #: the piece of the split (split routing; 0 otherwise): shares sort by (split, part)
    part: int = 0
    #: the exchange file holding the payload instead (exchange.py), or ""
    path: str = ""
    records_in: int = 0
    dead_letters: list[DeadLetter] = field(default_factory=list)
    map_s: float = 0.0
    #: event-time jobs: what the map saw (eventtime.TaskEventTime)
    event_time: Any = None


def exchange_root(master: str | None) -> str | None:
    """Where epochs' exchange directories go, or None when there is none for this master."""
    configured = config.current().exchange_dir
    if configured:
        return configured
    if master is not None and master.startswith("local"):
        return os.path.join(tempfile.gettempdir(), f"epochal-exchange-{os.getuid()}")
    return None


@contextmanager
def epoch_directory(root: str, epoch: int) -> Iterator[str]:
    """A fresh directory for one epoch attempt's exchange files, removed afterwards."""
    path = os.path.join(root, f"epoch-{epoch}-{uuid.uuid4().hex}")
    os.makedirs(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def write_shares(
    directory: str, shares: Iterable[tuple[int, MapShare]]
) -> list[tuple[int, MapShare]]:
    """Write each share's payload to a file (atomically: two tasks may map the same piece, with
    identical bytes); the shares returned name the file instead."""
    written = []
    for task, share in shares:
        path = os.path.join(directory, f"{share.split_index}-{share.part}-to-{task}.arrow")
        _write_atomic(path, share.payload)
        written.append((task, replace(share, payload=b"", path=path)))
    return written


def read_table(path: str) -> pa.Table:
    """The table a map task wrote (memory-mapped, not copied)."""
    return pa.ipc.open_stream(pa.memory_map(path)).read_all()


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _listing(directory: str, key: tuple[int, int]) -> str:
    return os.path.join(directory, f"written-{key[0]}-{key[1]}.pickle")


def publish(directory: str, key: tuple[int, int], shares: list[tuple[int, MapShare]]) -> None:
    """Say what the map of piece `key` (split index, part) wrote."""
    _write_atomic(_listing(directory, key), pickle.dumps(shares, protocol=5))


def published(directory: str, key: tuple[int, int]) -> list[tuple[int, MapShare]] | None:
    """What the map of piece `key` wrote, or None when no task has published it yet."""
    try:
        with open(_listing(directory, key), "rb") as f:
            shares: list[tuple[int, MapShare]] = pickle.load(f)
            return shares
    except FileNotFoundError:
        return None


def claim(directory: str, key: tuple[int, int]) -> bool:
    """True for the first task to claim piece `key` (the one that maps it); False when another
    task has it (its owner, or a task that took it over)."""
    try:
        os.close(os.open(_listing(directory, key) + ".claim", os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


def wait_published(
    directory: str, key: tuple[int, int], timeout_s: float
) -> list[tuple[int, MapShare]] | None:
    """Poll (every millisecond or so, backing off to 5 ms) until piece `key` is published, or
    None after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    delay = 0.0005
    while True:
        shares = published(directory, key)
        if shares is not None or time.monotonic() >= deadline:
            return shares
        time.sleep(delay)
        delay = min(delay * 2, 0.005)
