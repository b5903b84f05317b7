"""S3-compatible backend (AWS S3, MinIO, Ceph RGW, moto …) through boto3.

Atomicity comes from the server: a PUT replaces an object whole, so readers never see a
partial value, and conditional writes give compare-and-swap — ``If-None-Match: *`` to
create a key only if absent, ``If-Match: <etag>`` to replace it only if unchanged. The
version token is the ETag.

A server that silently ignores those headers would turn every CAS into a blind overwrite
(lost updates). So before the first conditional write to a bucket and prefix, each
process probes the server under ``<prefix>/.epochal-probe/``; if a conditional write that
must fail succeeds, every conditional write raises `StoreConfigError` and nothing is
written through it. Unconditional writes (`put`, used for content-addressed objects whose
bytes are fixed by their key) stay safe on such a server; refs, reflog and control
documents do not, and the store refuses to move them.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    IncompleteReadError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from snapshots_store.backends.base import Blob, KeyInfo, check_key
from snapshots_store.backends.retry import RetryPolicy
from snapshots_store.errors import StoreConfigError, StoreError

_CONFLICT_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "412", "409"})
T = TypeVar("T")
_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_TRANSIENT_CODES = frozenset(
    {"SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout", "Throttling",
     "ThrottlingException", "RequestTimeTooSkewed"}
)  # fmt: skip
PROBE_PREFIX = ".epochal-probe"


@dataclass(frozen=True)
class S3Credentials:
    """An access key given explicitly (a registered store's, read from the environment
    variables it names at use time) instead of boto3's own search."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def transient(exc: Exception) -> bool:
    """Whether the same request may succeed when sent again: a server error or throttling
    answer, a connection refused, reset or closed early, a connect or read timeout."""
    if isinstance(exc, ClientError):
        return _status(exc) >= 500 or _status(exc) == 429 or _code(exc) in _TRANSIENT_CODES
    return isinstance(exc, BotoConnectionError | HTTPClientError | IncompleteReadError)


class S3Backend:
    """Keys are objects ``<prefix>/<key>`` in one bucket."""

    def __init__(
        self,
        *,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        client: Any = None,
        credentials: S3Credentials | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        if self.prefix:
            check_key(self.prefix)
        query = f"?endpoint_url={endpoint_url}" if endpoint_url else ""
        self.url = f"s3://{bucket}/{self.prefix}{query}"
        self._endpoint_url = endpoint_url
        self._region = region
        self._given_client = client
        self._credentials = credentials
        self.retry = retry if retry is not None else RetryPolicy.from_env()

    @property
    def _client(self) -> Any:
        """The process's client for this endpoint (re-created after a fork)."""
        if self._given_client is not None:
            return self._given_client
        return _shared_client(
            self._endpoint_url, self._region or "us-east-1", self._credentials, self.retry
        )

    @property
    def _probe_key(self) -> tuple[int, str | None, str, str]:
        return (os.getpid(), self._endpoint_url, self.bucket, self.prefix)

    def __reduce__(
        self,
    ) -> tuple[Any, tuple[str, str, str | None, str | None, S3Credentials | None, RetryPolicy]]:
        """Pickle as its configuration (for Spark executors); the client is per process."""
        return (
            _rebuild,
            (
                self.bucket,
                self.prefix,
                self._endpoint_url,
                self._region,
                self._credentials,
                self.retry,
            ),
        )

    def _call(self, verb: str, full: str, request: Callable[[], T]) -> T:
        """`request()` with the retry policy: transient failures are retried within its budget,
        then `StoreUnavailableError`; other errors pass through at once."""
        return self.retry.call(self.url, f"{verb} s3://{self.bucket}/{full}", request, transient)

    def _full(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _rel(self, full: str) -> str:
        return full[len(self.prefix) + 1 :] if self.prefix else full

    def _fail(self, action: str, key: str, exc: Exception) -> StoreError:
        return StoreError(
            f"S3 {action} of s3://{self.bucket}/{key} failed: {exc}; check the endpoint, "
            f"bucket and credentials, then retry"
        )

    # -- reads ---------------------------------------------------------------------------

    def get(self, key: str) -> Blob | None:
        full = self._full(key)

        def request() -> tuple[bytes, str]:
            response = self._client.get_object(Bucket=self.bucket, Key=full)
            return response["Body"].read(), str(response["ETag"])

        try:
            data, version = self._call("GET", full, request)
        except ClientError as exc:
            if _code(exc) in _MISSING_CODES:
                return None
            raise self._fail("GET", full, exc) from exc
        except BotoCoreError as exc:
            raise self._fail("GET", full, exc) from exc
        return Blob(data, version)

    def get_range_into(self, key: str, start: int, buffer: memoryview) -> int | None:
        data = self.get_range(key, start, len(buffer))
        if data is None:
            return None
        buffer[: len(data)] = data
        return len(data)

    def prefetch(self, key: str, start: int, length: int) -> None:
        """Nothing: a ranged GET is one request, there is no cache to warm."""

    def get_range(self, key: str, start: int, length: int) -> bytes | None:
        if start < 0 or length < 0:
            raise ValueError(f"a byte range starts and runs at >= 0, not {start}+{length}")
        if length == 0:
            return b"" if self.stat(key) is not None else None
        full = self._full(key)

        def request() -> bytes:
            response = self._client.get_object(
                Bucket=self.bucket, Key=full, Range=f"bytes={start}-{start + length - 1}"
            )
            return bytes(response["Body"].read())

        try:
            data = self._call("GET", full, request)
        except ClientError as exc:
            if _code(exc) in _MISSING_CODES:
                return None
            if _code(exc) == "InvalidRange":  # starts at or past the end
                return b""
            raise self._fail("GET", full, exc) from exc
        except BotoCoreError as exc:
            raise self._fail("GET", full, exc) from exc
        return data

    def stat(self, key: str) -> KeyInfo | None:
        full = self._full(key)
        try:
            response = self._call(
                "HEAD", full, lambda: self._client.head_object(Bucket=self.bucket, Key=full)
            )
        except ClientError as exc:
            if _code(exc) in _MISSING_CODES or _status(exc) == 404:
                return None
            raise self._fail("HEAD", full, exc) from exc
        except BotoCoreError as exc:
            raise self._fail("HEAD", full, exc) from exc
        return KeyInfo(key, int(response["ContentLength"]), _utc(response["LastModified"]))

    def list(self, prefix: str) -> Iterator[KeyInfo]:
        full_prefix = f"{self.prefix}/{prefix}" if self.prefix else prefix
        token: dict[str, str] = {}

        def page_request(after: dict[str, str]) -> Callable[[], Any]:
            return lambda: self._client.list_objects_v2(
                Bucket=self.bucket, Prefix=full_prefix, **after
            )

        try:
            while True:  # page by page, each page's request retried on its own
                page = self._call("LIST", full_prefix, page_request(token))
                for item in page.get("Contents", []):
                    key = self._rel(item["Key"])
                    yield KeyInfo(key, int(item["Size"]), _utc(item["LastModified"]))
                if not page.get("IsTruncated"):
                    break
                token = {"ContinuationToken": page["NextContinuationToken"]}
        except ClientError as exc:
            if _code(exc) == "NoSuchBucket":
                raise StoreConfigError(
                    f"bucket {self.bucket!r} does not exist; create it or fix STORE_URL"
                ) from exc
            raise self._fail("LIST", full_prefix, exc) from exc
        except BotoCoreError as exc:
            raise self._fail("LIST", full_prefix, exc) from exc

    def list_partial(self, prefix: str) -> Iterator[KeyInfo]:
        """Always empty: an S3 PUT is all-or-nothing (single-part uploads only)."""
        return iter(())

    # -- writes --------------------------------------------------------------------------

    def _put(self, key: str, data: bytes, **conditions: str) -> str | None:
        full = self._full(key)
        sent = [0]

        def request() -> Any:
            sent[0] += 1
            return self._client.put_object(Bucket=self.bucket, Key=full, Body=data, **conditions)

        try:
            response = self._call("PUT", full, request)
        except ClientError as exc:
            refused = _code(exc) in _CONFLICT_CODES or _status(exc) in (409, 412)
            vanished = _code(exc) in _MISSING_CODES or _status(exc) == 404
            if (conditions and refused) or (conditions.get("IfMatch") and vanished):
                # a retried conditional write refused: was the refusal caused by our own
                # earlier attempt whose answer was lost? Then the key holds our bytes.
                return self._settle(key, data) if sent[0] > 1 else None
            if _code(exc) == "NoSuchBucket":
                raise StoreConfigError(
                    f"bucket {self.bucket!r} does not exist; create it or fix STORE_URL"
                ) from exc
            raise self._fail("PUT", full, exc) from exc
        except BotoCoreError as exc:
            raise self._fail("PUT", full, exc) from exc
        return str(response["ETag"])

    def _settle(self, key: str, data: bytes) -> str | None:
        """The version of `key` when it holds exactly `data` (our write landed), else None."""
        current = self.get(key)
        return current.version if current is not None and current.data == data else None

    def put(self, key: str, data: bytes) -> str:
        version = self._put(key, data)
        assert version is not None
        return version

    def put_if_absent(self, key: str, data: bytes) -> str | None:
        self._require_conditional_writes()
        return self._put(key, data, IfNoneMatch="*")

    def put_if_match(self, key: str, data: bytes, version: str) -> str | None:
        self._require_conditional_writes()
        return self._put(key, data, IfMatch=version)

    def delete(self, key: str) -> None:
        full = self._full(key)
        try:
            self._call(
                "DELETE", full, lambda: self._client.delete_object(Bucket=self.bucket, Key=full)
            )
        except ClientError as exc:
            if _code(exc) in _MISSING_CODES:
                return
            raise self._fail("DELETE", full, exc) from exc
        except BotoCoreError as exc:
            raise self._fail("DELETE", full, exc) from exc

    # -- capability probe ----------------------------------------------------------------

    @property
    def conditional_writes_ok(self) -> bool | None:
        """Result of the probe (None: not probed yet in this process)."""
        return _PROBED.get(self._probe_key)

    def _require_conditional_writes(self) -> None:
        if self.conditional_writes_ok is None:
            with _PROBE_LOCK:
                if self.conditional_writes_ok is None:
                    _PROBED[self._probe_key] = self._probe()
        if not self.conditional_writes_ok:
            raise StoreConfigError(
                f"the S3 server behind {self.url} ignores conditional writes (If-None-Match / "
                f"If-Match); refs cannot be moved safely there. Use AWS S3, a recent MinIO or "
                f"another server that supports them"
            )

    def _probe(self) -> bool:
        """True when the server rejects a create over an existing key and a stale If-Match."""
        key = f"{PROBE_PREFIX}/{uuid.uuid4().hex}"
        try:
            first = self._put(key, b"1", IfNoneMatch="*")
            if first is None:
                return False
            if self._put(key, b"2", IfNoneMatch="*") is not None:
                return False
            stale = '"00000000000000000000000000000000"'
            return self._put(key, b"3", IfMatch=stale) is None
        finally:
            self.delete(key)


_CLIENT_LOCK = threading.Lock()
_PROBE_LOCK = threading.Lock()
_CLIENTS: dict[tuple[int, str | None, str, S3Credentials | None, float, float], Any] = {}
_PROBED: dict[tuple[int, str | None, str, str], bool] = {}


def _shared_client(
    endpoint_url: str | None,
    region: str,
    credentials: S3Credentials | None,
    retry: RetryPolicy,
) -> Any:
    """One boto3 client per process, endpoint, region, credentials and timeouts: clients are
    thread-safe but expensive to create, and must not cross a fork (the key includes the pid).
    botocore's own retries are off: `RetryPolicy` decides, with a budget the store sets."""
    timeouts = (retry.connect_timeout_s, retry.read_timeout_s)
    key = (os.getpid(), endpoint_url, region, credentials, *timeouts)
    with _CLIENT_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            client = boto3.client(
                "s3",
                endpoint_url=endpoint_url,
                region_name=region,
                aws_access_key_id=credentials.access_key_id if credentials else None,
                aws_secret_access_key=credentials.secret_access_key if credentials else None,
                aws_session_token=credentials.session_token if credentials else None,
                config=Config(
                    retries={"total_max_attempts": 1, "mode": "standard"},
                    connect_timeout=retry.connect_timeout_s,
                    read_timeout=retry.read_timeout_s,
                    s3={"addressing_style": "path"} if endpoint_url else None,
                ),
            )
            _CLIENTS[key] = client
        return client


def _rebuild(
    bucket: str,
    prefix: str,
    endpoint_url: str | None,
    region: str | None,
    credentials: S3Credentials | None = None,
    retry: RetryPolicy | None = None,
) -> S3Backend:
    return S3Backend(
        bucket=bucket,
        prefix=prefix,
        endpoint_url=endpoint_url,
        region=region,
        credentials=credentials,
        retry=retry,
    )


def _utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)
