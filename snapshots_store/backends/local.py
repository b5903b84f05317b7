"""Local filesystem backend: one file per key under a root directory.

Durability: every write goes to a temp file in the target directory, is fsynced, then
renamed (or hard-linked, for create-only writes) into place, and the directory is fsynced.
Compare-and-swap takes an exclusive `flock` on a per-key lock file under ``<root>/.locks``,
so it holds across processes on one host (and on network filesystems whose `flock` is
coherent). Temp files left by a killed writer are reported by `list_partial`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import secrets
import stat
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from snapshots_store.backends.base import Blob, KeyInfo, check_key
from snapshots_store.errors import StoreConfigError, StoreError, StoreFullError

_TMP_MARK = ".tmp-"
LOCK_DIR = ".locks"


def _version(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalBackend:
    """Keys are files below `root`; the root is created on the first write, not before."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(os.path.abspath(root))
        self.url = self.root.as_uri()

    # -- paths ---------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    def _ensure_dir(self, directory: Path) -> None:
        """Create `directory` and missing parents, fsyncing each new entry's parent."""
        missing: list[Path] = []
        cursor = directory
        while not cursor.is_dir():
            missing.append(cursor)
            if cursor.parent == cursor:
                break
            cursor = cursor.parent
        for path in reversed(missing):
            try:
                path.mkdir()
            except FileExistsError:
                if not path.is_dir():
                    raise self._conflict(path) from None
                continue
            except NotADirectoryError:
                raise self._conflict(path) from None
            _fsync_dir(path.parent)

    def _conflict(self, path: Path) -> StoreError:
        return StoreError(
            f"cannot create {path}: a file of the store occupies a directory name on its "
            f"path (e.g. ref `a` exists and `a/b` was requested); choose another name"
        )

    # -- writes --------------------------------------------------------------------------

    def _write_temp(self, path: Path, data: bytes) -> Path:
        self._ensure_dir(path.parent)
        tmp = path.with_name(f".{path.name}{_TMP_MARK}{secrets.token_hex(8)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        os.close(fd)
        return tmp

    def _replace(self, path: Path, data: bytes) -> str:
        tmp = self._write_temp(path, data)
        try:
            os.replace(tmp, path)
        except IsADirectoryError:
            os.unlink(tmp)
            raise self._conflict(path) from None
        _fsync_dir(path.parent)
        return _version(data)

    @contextlib.contextmanager
    def _space(self, key: str) -> Iterator[None]:
        """A full filesystem (or quota) as `StoreFullError` naming the store and the key."""
        try:
            yield
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreFullError(self.url, key, os.strerror(exc.errno)) from exc
            raise

    def put(self, key: str, data: bytes) -> str:
        with self._space(key):
            return self._replace(self._path(key), data)

    def put_if_absent(self, key: str, data: bytes) -> str | None:
        with self._space(key):
            return self._put_if_absent(key, data)

    def _put_if_absent(self, key: str, data: bytes) -> str | None:
        path = self._path(key)
        if path.exists():
            return None
        tmp = self._write_temp(path, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return None
        except OSError as exc:
            if exc.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise StoreConfigError(
                    f"the filesystem under {self.root} does not support hard links, which the "
                    f"local backend needs for atomic create-only writes; use a local disk"
                ) from exc
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        _fsync_dir(path.parent)
        return _version(data)

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        lock_dir = self.root / LOCK_DIR
        self._ensure_dir(lock_dir)
        lock_path = lock_dir / hashlib.sha256(key.encode()).hexdigest()
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def put_if_match(self, key: str, data: bytes, version: str) -> str | None:
        path = self._path(key)
        with self._space(key), self._locked(key):
            current = self._read(path)
            if current is None or _version(current) != version:
                return None
            return self._replace(path, data)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError):
            return
        except IsADirectoryError:
            return
        _fsync_dir(path.parent)

    # -- reads ---------------------------------------------------------------------------

    @staticmethod
    def _read(path: Path) -> bytes | None:
        try:
            with open(path, "rb") as handle:
                return handle.read()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def get(self, key: str) -> Blob | None:
        data = self._read(self._path(key))
        return None if data is None else Blob(data, _version(data))

    def get_range(self, key: str, start: int, length: int) -> bytes | None:
        if start < 0 or length < 0:
            raise ValueError(f"a byte range starts and runs at >= 0, not {start}+{length}")
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        try:
            parts = []
            while length > 0:
                part = os.pread(fd, length, start)
                if not part:
                    break
                parts.append(part)
                start += len(part)
                length -= len(part)
            return b"".join(parts)
        finally:
            os.close(fd)

    def get_range_into(self, key: str, start: int, buffer: memoryview) -> int | None:
        if start < 0:
            raise ValueError(f"a byte range starts at >= 0, not {start}")
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        try:
            done = 0
            while done < len(buffer):
                got = os.preadv(fd, [buffer[done:]], start + done)
                if not got:
                    break
                done += got
            return done
        finally:
            os.close(fd)

    def prefetch(self, key: str, start: int, length: int) -> None:
        """``posix_fadvise(WILLNEED)`` on the range: the kernel starts reading it into the
        page cache and returns (a later `get_range` finds it there or waits for it)."""
        advise = getattr(os, "posix_fadvise", None)
        if advise is None or length <= 0 or start < 0:
            return
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except OSError:
            return
        try:
            advise(fd, start, length, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)

    def stat(self, key: str) -> KeyInfo | None:
        try:
            result = os.stat(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISREG(result.st_mode):
            return None
        return KeyInfo(key, result.st_size, datetime.fromtimestamp(result.st_mtime, UTC))

    def _walk(self, prefix: str, *, partial: bool) -> Iterator[KeyInfo]:
        if prefix.startswith("/") or "\0" in prefix or ".." in prefix.split("/"):
            raise StoreConfigError(f"list prefix {prefix!r} must be a relative key prefix")
        base_key = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        base = self.root.joinpath(*base_key.split("/")) if base_key else self.root
        if not base.is_dir():
            return
        for dirpath, dirnames, filenames in os.walk(base):
            rel_dir = os.path.relpath(dirpath, self.root)
            rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                is_partial = name.startswith(".") and _TMP_MARK in name
                if name.startswith(".") and not is_partial:
                    continue
                if is_partial != partial:
                    continue
                key = rel_dir + name
                if not key.startswith(prefix):
                    continue
                try:
                    result = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue
                yield KeyInfo(key, result.st_size, datetime.fromtimestamp(result.st_mtime, UTC))

    def list(self, prefix: str) -> Iterator[KeyInfo]:
        return self._walk(prefix, partial=False)

    def list_partial(self, prefix: str) -> Iterator[KeyInfo]:
        return self._walk(prefix, partial=True)
