"""How an operation kind is declared: validated parameters and an ordered list of phases.

A phase is a function of a `PhaseContext`. It must be idempotent: when a worker dies in the
middle of it, another worker runs it again from the start, with the same `context` values
the earlier attempt recorded (`ctx.remember` / `ctx.data`). Phases may wait (polling with
`ctx.wait_until`), report progress (`ctx.progress`), and fail the operation with
`OperationFailed`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from controlplane.errors import OperationFailed

if TYPE_CHECKING:
    from controlplane.applications.models import Application
    from controlplane.jobs.models import Job
    from controlplane.operations.models import Operation

T = TypeVar("T")


class CancelledError(Exception):
    """The operation was cancelled at a phase boundary (or while a phase waited)."""


@dataclass(frozen=True)
class Phase:
    name: str
    run: Callable[[PhaseContext], None]
    cancellable: bool = False
    """Whether a cancel request may end the operation while this phase runs or before it."""


@dataclass(frozen=True)
class Target:
    """What a request names: the application, and the job when the operation acts on one;
    `user` is who asks, for parameters only an admin may give: None is the deployment itself
    (the `epochal` command on the control plane without --as), which acts as an admin."""

    application: Application
    job: Job | None
    user: Any = None


class OperationSpec:
    """One operation kind. Subclasses set `kind`, `needs_job` and implement the rest."""

    kind: str = ""
    needs_job: bool = True
    summary: str = ""

    def authorize(self, params: Mapping[str, Any], target: Target) -> None:
        """Raise Forbidden when `target.user` may not give these parameters at all (checked
        before the parameters' schema: a 403 says more than a 400 about their values)."""

    def clean(self, params: Mapping[str, Any], target: Target) -> dict[str, Any]:
        """Validated, normalised parameters; raise InvalidRequest naming the bad fields."""
        raise NotImplementedError

    def phases(self, params: Mapping[str, Any]) -> list[Phase]:
        raise NotImplementedError

    def creates_branch(self, params: Mapping[str, Any]) -> str:
        """The new branch the operation creates ("" for none): at most one active operation
        may create a given branch of an application (a unique index decides races)."""
        return ""


class PhaseContext:
    """What a running phase sees; writes go to the operation row immediately."""

    def __init__(
        self,
        operation: Operation,
        phase: str,
        heartbeat: Callable[[], None],
        report_progress: Callable[[float, str], None],
    ) -> None:
        """`report_progress(fraction, detail)` records this phase's progress (the executor's)."""
        self.operation = operation
        self.phase = phase
        self._heartbeat = heartbeat
        self._report_progress = report_progress

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.operation.params)

    @property
    def data(self) -> dict[str, Any]:
        return dict(self.operation.context)

    @property
    def job(self) -> Job:
        job = self.operation.job
        if job is None:
            raise OperationFailed(f"operation {self.operation.pk} has no job", code="no_job")
        job.refresh_from_db()
        return job

    def remember(self, key: str, compute: Callable[[], T]) -> T:
        """`context[key]`, computed and saved on first use: the same value on every retry."""
        context = self.operation.context
        if key not in context:
            context[key] = compute()
            self.operation.save(update_fields=["context", "updated_at"])
        return context[key]

    def forget(self, *keys: str) -> None:
        for key in keys:
            self.operation.context.pop(key, None)
        self.operation.save(update_fields=["context", "updated_at"])

    def progress(self, fraction: float, detail: str = "") -> None:
        self._report_progress(fraction, detail)
        self._heartbeat()

    def check_cancel(self) -> None:
        from controlplane.operations.models import Operation

        if Operation.objects.filter(pk=self.operation.pk, cancel_requested=True).exists():
            raise CancelledError(self.phase)

    def wait_until(
        self,
        condition: Callable[[], T | None],
        *,
        timeout_s: float,
        what: str,
        interval_s: float = 0.5,
        cancellable: bool = False,
    ) -> T:
        """Poll `condition` until it returns something not None; fail after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = condition()
            if value is not None:
                return value
            if cancellable:
                self.check_cancel()
            if time.monotonic() >= deadline:
                raise OperationFailed(
                    f"timed out after {timeout_s:g} s waiting for {what}", code="timeout"
                )
            self._heartbeat()
            time.sleep(interval_s)
