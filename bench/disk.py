"""The disk's own sequential read bandwidth, and dropping files from the page cache.

A restore benchmark compares the engine's restore rate with what the disk delivers, measured
in the same run on files written the way the store writes its objects (temp file, fsync,
rename: `LocalBackend.put`) and read cold. Cold means out of the page cache: as root,
``echo 3 > /proc/sys/vm/drop_caches`` (the whole machine); otherwise
``posix_fadvise(POSIX_FADV_DONTNEED)`` on every file (after an fsync, so no dirty page stays).
The same method is used for the store's files and the baseline's, and recorded.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from snapshots_store.backends.local import LocalBackend

READ_BYTES = 32 * 1024**2  # one read() of the baseline: long sequential reads


def drop_page_cache(files: Iterable[Path]) -> str:
    """Evict `files` from the page cache; returns the method used (``drop_caches`` or
    ``fadvise``)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as handle:
            handle.write("3\n")
        return "drop_caches"
    except OSError:
        pass
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return "fadvise"


def write_like_the_store(directory: Path, sizes: Sequence[int]) -> list[Path]:
    """Files of the given sizes (incompressible bytes) written by the store's own local
    backend: temp file, fsync, rename, directory fsync."""
    backend = LocalBackend(directory)
    paths = []
    for index, size in enumerate(sizes):
        key = f"baseline/{index:05d}"
        backend.put(key, os.urandom(size))
        paths.append(directory / "baseline" / f"{index:05d}")
    return paths


def sequential_read_mb_s(files: Sequence[Path]) -> tuple[float, int, float]:
    """(MB/s, bytes, seconds) of reading `files` one after the other in `READ_BYTES` reads."""
    total = 0
    started = time.perf_counter()
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            while True:
                block = os.read(fd, READ_BYTES)
                if not block:
                    break
                total += len(block)
        finally:
            os.close(fd)
    seconds = time.perf_counter() - started
    return total / 1e6 / seconds, total, seconds


def parallel_read_mb_s(
    files: Sequence[Path], *, streams: int, read_bytes: int, read_ahead: int
) -> tuple[float, int, float]:
    """(MB/s, bytes, seconds) of reading `files` the way the engine's restore stage reads the
    store's packs (`runners.engine.state.restore.restore_claimed`): `streams` threads (the stage's
    tasks times their reading threads) each claim the next file nobody has taken and read it in
    `read_bytes` reads, while a read-ahead thread asks the kernel (``posix_fadvise(WILLNEED)``)
    to start reading the files after the claims, up to `read_ahead` bytes ahead (0: none)."""
    sizes = [path.stat().st_size for path in files]
    lock = threading.Condition()
    position = 0  # the next file nobody has claimed
    total = 0
    errors: list[BaseException] = []
    done = threading.Event()

    def claim() -> int | None:
        nonlocal position
        with lock:
            if position >= len(files):
                return None
            position += 1
            lock.notify_all()
            return position - 1

    def work() -> None:
        nonlocal total
        try:
            while (index := claim()) is not None:
                fd = os.open(files[index], os.O_RDONLY)
                got = 0
                try:
                    while block := os.pread(fd, read_bytes, got):
                        got += len(block)
                finally:
                    os.close(fd)
                with lock:
                    total += got
        except BaseException as exc:
            errors.append(exc)
            done.set()

    def ahead() -> None:
        advised = 0  # the next file to advise
        while not done.is_set():
            with lock:
                advised = max(advised, position)
                if advised >= len(files):
                    return
                if sum(sizes[position:advised]) >= read_ahead:
                    lock.wait(0.05)
                    continue
            fd = os.open(files[advised], os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, sizes[advised], os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)
            advised += 1

    started = time.perf_counter()
    threads = [threading.Thread(target=work) for _ in range(streams)]
    if read_ahead > 0:
        threads.append(threading.Thread(target=ahead, daemon=True))
    for thread in threads:
        thread.start()
    for thread in threads[:streams]:
        thread.join()
    seconds = time.perf_counter() - started
    done.set()
    for thread in threads[streams:]:
        thread.join()
    if errors:
        raise errors[0]
    return total / 1e6 / seconds, total, seconds
