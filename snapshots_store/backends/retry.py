"""Retries of a remote store's requests: exponential backoff with full jitter, bounded.

A request that fails transiently (a 5xx answer, ``SlowDown`` throttling, a reset connection, a
read past its timeout) is sent again after a random wait in ``[0, min(cap, base * 2**n))``
(the "full jitter" of AWS's backoff guidance: racing clients spread out instead of retrying in
lock-step), until it succeeds, `attempts` have been made, or the next wait would pass the time
`budget_s`; then `StoreUnavailableError` names the store and the request. Every write the
store makes is whole (a PUT replaces an object at once), so a retried write is harmless; a
conditional write whose answer was lost is settled by reading the key back (`settle`).

Configured by the environment of the process that talks to the store (driver and executors
alike): ``EPOCHAL_STORE_RETRY_ATTEMPTS`` (default 10), ``EPOCHAL_STORE_RETRY_BUDGET_S``
(60), ``EPOCHAL_STORE_RETRY_BASE_S`` (0.1), ``EPOCHAL_STORE_RETRY_CAP_S`` (5),
``EPOCHAL_STORE_CONNECT_TIMEOUT_S`` (5) and ``EPOCHAL_STORE_READ_TIMEOUT_S`` (30).
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from snapshots_store.errors import StoreConfigError, StoreUnavailableError

T = TypeVar("T")
log = logging.getLogger("snapshots_store.retry")

_ENV = {
    "attempts": "EPOCHAL_STORE_RETRY_ATTEMPTS",
    "budget_s": "EPOCHAL_STORE_RETRY_BUDGET_S",
    "base_s": "EPOCHAL_STORE_RETRY_BASE_S",
    "cap_s": "EPOCHAL_STORE_RETRY_CAP_S",
    "connect_timeout_s": "EPOCHAL_STORE_CONNECT_TIMEOUT_S",
    "read_timeout_s": "EPOCHAL_STORE_READ_TIMEOUT_S",
}


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 10
    budget_s: float = 60.0
    base_s: float = 0.1
    cap_s: float = 5.0
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise StoreConfigError(f"{_ENV['attempts']} must be >= 1, not {self.attempts}")
        for name in ("budget_s", "base_s", "cap_s", "connect_timeout_s", "read_timeout_s"):
            if not getattr(self, name) > 0:
                raise StoreConfigError(f"{_ENV[name]} must be > 0, not {getattr(self, name)}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RetryPolicy:
        environ = os.environ if environ is None else environ
        values: dict[str, float | int] = {}
        for name, variable in _ENV.items():
            raw = environ.get(variable, "").strip()
            if not raw:
                continue
            try:
                values[name] = int(raw) if name == "attempts" else float(raw)
            except ValueError:
                kind = "an integer" if name == "attempts" else "a number of seconds"
                raise StoreConfigError(f"{variable}={raw!r} is not {kind}") from None
        return cls(**values)  # type: ignore[arg-type]

    def wait_s(self, retry: int, rng: random.Random) -> float:
        """The wait before retry number `retry` (0 for the first retry): full jitter."""
        return rng.uniform(0.0, min(self.cap_s, self.base_s * 2**retry))

    def call(
        self,
        store: str,
        action: str,
        request: Callable[[], T],
        transient: Callable[[Exception], bool],
        *,
        rng: random.Random | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> T:
        """`request()`, sent again after each transient failure within the budget."""
        rng = rng or random.Random()
        began = time.monotonic()
        for attempt in range(1, self.attempts + 1):
            try:
                return request()
            except Exception as exc:
                if not transient(exc):
                    raise
                elapsed = time.monotonic() - began
                wait = self.wait_s(attempt - 1, rng)
                if attempt == self.attempts or elapsed + wait > self.budget_s:
                    log.error("store %s: %s gave up after %d attempts: %s", store, action,
                              attempt, exc)  # fmt: skip
                    raise StoreUnavailableError(
                        store, action, attempt, elapsed, _describe(exc)
                    ) from exc
                log.warning("store %s: %s failed (attempt %d, retry in %.2f s): %s",
                            store, action, attempt, wait, exc)  # fmt: skip
                sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover


def _describe(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
