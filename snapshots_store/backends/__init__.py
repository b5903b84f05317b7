"""Storage backends behind one `Backend` protocol, chosen by URL."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, unquote, urlsplit

from snapshots_store.backends.base import Backend, Blob, KeyInfo, PrefixedBackend, check_key
from snapshots_store.backends.local import LocalBackend
from snapshots_store.errors import StoreConfigError

if TYPE_CHECKING:
    from snapshots_store.backends.s3 import S3Credentials

__all__ = [
    "Backend",
    "Blob",
    "KeyInfo",
    "LocalBackend",
    "PrefixedBackend",
    "check_key",
    "local_store_url",
    "open_backend",
]


def local_store_url(url: str, *, root: Path, default: Path) -> str:
    """`url` with a relative `file://` path taken relative to `root` (not the current directory);
    `file://<default>` when `url` is empty. Other URLs are returned unchanged."""
    if not url:
        return f"file://{default}"
    if url.startswith("file://") and not url.startswith("file:///"):
        return f"file://{(root / url.removeprefix('file://')).resolve()}"
    return url


def open_backend(url: str, *, credentials: S3Credentials | None = None) -> Backend:
    """The backend for a store URL.

    * ``file:///abs/path``, ``file://relative/path`` (relative to the current directory),
      or a plain path;
    * ``s3://bucket[/prefix][?endpoint_url=http://host:port&region=…]``; credentials come
      from the usual boto3 sources (environment, profile, instance role), or are given
      (`credentials`: a registered store's). A `file://` store takes none.
    """
    if not isinstance(url, str) or not url:
        raise StoreConfigError("the store URL is empty; set STORE_URL, e.g. file://var/store")
    parts = urlsplit(url)
    if parts.scheme in ("", "file"):
        if parts.query or parts.fragment:
            raise StoreConfigError(f"store URL {url!r}: file URLs take no query or fragment")
        path = unquote(parts.netloc + parts.path) if parts.scheme else url
        if not path:
            raise StoreConfigError(f"store URL {url!r} names no directory")
        return LocalBackend(os.path.abspath(path))
    if parts.scheme == "s3":
        from snapshots_store.backends.s3 import S3Backend

        if not parts.netloc:
            raise StoreConfigError(f"store URL {url!r} names no bucket: s3://bucket/prefix")
        options = {k: v[-1] for k, v in parse_qs(parts.query, strict_parsing=False).items()}
        unknown = sorted(set(options) - {"endpoint_url", "region"})
        if unknown:
            raise StoreConfigError(
                f"store URL {url!r}: unknown option {unknown[0]!r} (known: endpoint_url, region)"
            )
        return S3Backend(
            bucket=parts.netloc,
            prefix=unquote(parts.path).strip("/"),
            endpoint_url=options.get("endpoint_url"),
            region=options.get("region"),
            credentials=credentials,
        )
    raise StoreConfigError(
        f"store URL {url!r} has unsupported scheme {parts.scheme!r}; use file:// or s3://"
    )
