"""A small filesystem of its own for disk-full tests: a tmpfs of a few hundred KiB mounted on a
temporary directory (needs CAP_SYS_ADMIN: root on this machine and in CI). Without the
capability the test is skipped (or, in CI, fails) saying so: a directory under a quota we cannot
set would not fill up, and faking ENOSPC would not test the filesystem."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import require_service


@contextlib.contextmanager
def small_disk(size_kib: int) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="epochal-disk-") as tmp:
        mount = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0755", "tmpfs", tmp],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        require_service("a tmpfs mount (CAP_SYS_ADMIN)", mount.returncode == 0,
                        f"run as root with CAP_SYS_ADMIN: {mount.stderr.strip()}")  # fmt: skip
        try:
            yield Path(tmp)
        finally:
            subprocess.run(["umount", "-l", tmp], check=False, capture_output=True)


def fill(directory: Path) -> int:
    """Write a filler file until the filesystem is full; the bytes it holds."""
    written = 0
    with open(directory / "filler", "wb", buffering=0) as out:
        block = b"\1" * 4096
        with contextlib.suppress(OSError):
            while True:
                written += out.write(block) or 0
    return written


def grow(directory: Path, size_kib: int) -> None:
    """Resize the tmpfs (what an operator does when the volume is full)."""
    subprocess.run(
        ["mount", "-o", f"remount,size={size_kib}k", str(directory)],
        check=True, capture_output=True,
    )  # fmt: skip
