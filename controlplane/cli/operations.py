"""Operation verbs (`epochal rescale JOB -p 3` …): request, then follow the phases to the end.

By default the operation is recorded and a Celery worker executes it; the command prints each
phase as it starts, moves and ends (`step k/n`), and exits 0 only when the operation succeeded.
`--inline` executes it in the command's own process (no worker needed), `--no-wait` returns
right after the request. With `--json` the progress goes to stderr and stdout carries the
operation as one JSON object.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from collections.abc import Callable
from typing import Any

from django.contrib.auth import get_user_model

from controlplane.applications.models import Application
from controlplane.applications.selectors import application_get
from controlplane.audit.services import audit_request
from controlplane.changes.feed import wait_for_change
from controlplane.changes.keys import operation_key
from controlplane.changes.selectors import revision
from controlplane.cli.console import CliError, Console
from controlplane.cli.verb import Verb
from controlplane.errors import EpochalError
from controlplane.jobs.models import Job
from controlplane.jobs.selectors import job_get
from controlplane.operations.executor import execute
from controlplane.operations.models import TERMINAL_STATES, Operation
from controlplane.operations.selectors import operation_get, operation_list
from controlplane.operations.services import operation_cancel, operation_request

Params = Callable[[argparse.Namespace], dict[str, Any]]
Target = Callable[[argparse.Namespace], tuple[Application, Job | None]]
PENDING_HINT_S = 15.0


def _job_target(args: argparse.Namespace) -> tuple[Application, Job | None]:
    job = job_get(name=args.job)
    return job.application, job


def operation_verb(
    kind: str,
    help: str,
    add_params: Callable[[argparse.ArgumentParser], None],
    params: Params,
    *,
    target: Target | None = None,
) -> Verb:
    """A verb that requests one `kind` of operation and follows it."""

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        if target is None:
            parser.add_argument("job", help="job name (see `epochal jobs`)")
        add_params(parser)
        parser.add_argument("--reason", default="", help="why (recorded in the audit log)")
        parser.add_argument("--as", dest="as_user", help="requesting user (default: none)")
        parser.add_argument("--idempotency-key", default="", help="repeat-safe request key")
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument(
            "--inline", action="store_true", help="execute here instead of in a Celery worker"
        )
        mode.add_argument("--no-wait", action="store_true", help="print the id and return")
        parser.add_argument(
            "--timeout", type=float, default=1800, help="seconds to follow the operation"
        )

    def run(args: argparse.Namespace, console: Console) -> int:
        user = None
        if args.as_user:
            user = get_user_model().objects.filter(username=args.as_user).first()
            if user is None:
                raise CliError(f"no user {args.as_user!r}; create one with `manage.py createuser`")
        try:
            application, job = (target or _job_target)(args)
            requested = operation_request(
                kind=kind,
                application=application,
                job=job,
                params=params(args),
                user=user,
                idempotency_key=args.idempotency_key,
                reason=args.reason,
                via="cli",
                dispatch=not args.inline,
            )
        except EpochalError as exc:
            audit_request(
                user=user,
                action=f"cli {kind}",
                source="cli",
                outcome="refused",
                detail=exc.to_dict(),
            )
            raise
        op = requested.operation
        audit_request(
            user=user,
            action=f"cli {kind}",
            target=str(op.pk),
            source="cli",
            outcome="accepted" if requested.created else "repeated",
            operation=op,
        )
        word = "requested" if requested.created else "already requested (same idempotency key)"
        on = f" on job {job.name}" if job is not None else f" in application {application.name}"
        console.note(f"{kind} operation {op.pk} {word}{on}")
        if args.no_wait:
            if console.as_json:
                console.json(operation_dict(op))
            return 0
        if args.inline:
            execute(str(op.pk))
        final = follow(op, console.note, timeout_s=args.timeout)
        return finish(final, console)

    return Verb(kind, help, add_arguments, run)


def _seconds(record: dict[str, Any]) -> float | None:
    try:
        started = dt.datetime.fromisoformat(record["started_at"])
        finished = dt.datetime.fromisoformat(record["finished_at"])
    except (KeyError, TypeError, ValueError):
        return None
    return (finished - started).total_seconds()


def phase_line(op: Operation, step: int, record: dict[str, Any]) -> str:
    """`step 2/5  rescale_commit  running 40% — detail` for one phase of `op`."""
    state = record["state"]
    text = f"  step {step}/{len(op.phases)}  {record['name']:<16} {state}"
    fraction = float(record.get("progress") or 0.0)
    if state == "running" and fraction > 0:
        text += f" {fraction * 100:.0f}%"
    seconds = _seconds(record) if state == "succeeded" else None
    if seconds is not None:
        text += f" ({seconds:.1f} s)"
    if record.get("detail"):
        text += f" — {record['detail']}"
    return text


def follow(
    op: Operation, write: Callable[[str], None], *, timeout_s: float, recheck_s: float = 5.0
) -> Operation:
    """`write` each phase of `op` as it starts, moves and ends, until the operation ends.

    Between looks it waits for the operation's next recorded change (`controlplane.changes`:
    woken by a notification on PostgreSQL, not by polling), looking again at least every
    `recheck_s` seconds."""
    seen: dict[str, tuple[str, str, int]] = {}
    started = time.monotonic()
    hinted = False
    key = operation_key(op.pk)
    while True:
        known = revision(key)  # before the read: a change after it wakes the wait below
        op.refresh_from_db()
        for step, record in enumerate(op.phases, start=1):
            if record["state"] == "pending":
                continue
            tenth = int(float(record.get("progress") or 0.0) * 10)
            shown = (record["state"], record.get("detail") or "", tenth)
            if seen.get(record["name"]) != shown:
                seen[record["name"]] = shown
                write(phase_line(op, step, record))
        if op.state in TERMINAL_STATES:
            return op
        waited = time.monotonic() - started
        if waited > timeout_s:
            write(
                f"still {op.state} after {timeout_s:g} s; follow with "
                f"`epochal operation {op.pk} --wait`"
            )
            return op
        if op.state == "pending" and waited > PENDING_HINT_S and not hinted:
            hinted = True
            write("  (still pending: is a Celery worker running? or use --inline)")
        wait_for_change(key, known, deadline=min(started + timeout_s, time.monotonic() + recheck_s))


def _result_text(result: dict[str, Any]) -> str:
    parts = []
    for key, value in sorted(result.items()):
        shown = value if isinstance(value, str | int | float) else json.dumps(value)
        parts.append(f"{key}={shown}")
    return ", ".join(parts)


def finish(op: Operation, console: Console) -> int:
    """The operation's last line (or JSON); 0 only when it succeeded."""
    if console.as_json:
        console.json(operation_dict(op))
    elif op.state == "succeeded":
        result = _result_text(op.result)
        console.line(f"{op.kind} succeeded" + (f": {result}" if result else ""))
    elif op.state in TERMINAL_STATES:
        console.line(f"{op.kind} {op.state}: {op.error_message or op.error_code or 'no reason'}")
    else:
        console.line(f"{op.kind} {op.state} (step {_step(op)})")
    return 0 if op.state == "succeeded" else 1


def _step(op: Operation) -> str:
    names = [p["name"] for p in op.phases]
    if op.current_phase in names:
        return f"{names.index(op.current_phase) + 1}/{len(names)} {op.current_phase}"
    return f"-/{len(names)}"


def operation_dict(op: Operation) -> dict[str, Any]:
    """The operation as scripts see it (the same fields as the REST API's)."""
    return {
        "id": str(op.pk),
        "kind": op.kind,
        "state": op.state,
        "application": op.application.name,
        "job": op.job.name if op.job else None,
        "params": op.params,
        "reason": op.reason,
        "requested_via": op.requested_via,
        "phases": op.phases,
        "current_phase": op.current_phase,
        "progress": op.progress,
        "result": op.result,
        "error": {"code": op.error_code, "message": op.error_message} if op.error_code else None,
        "created_at": op.created_at.isoformat(),
        "finished_at": op.finished_at.isoformat() if op.finished_at else None,
    }


# -- the operation kinds ------------------------------------------------------------------------


def _no_params(parser: argparse.ArgumentParser) -> None:
    """No kind-specific arguments."""


def _start_params(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--from-empty", action="store_true", help="create an empty initial snapshot if none"
    )


def _stop_params(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--deadline", type=float, default=None, help="seconds (default 60)")


def _savepoint_params(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", help="tag name (default savepoint-<branch>-e<epoch>-<id>)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--snapshot", help="snapshot to tag (default: the head)")
    which.add_argument("--force-epoch", action="store_true", help="wait for a new epoch")


def _savepoint(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {"force_epoch": args.force_epoch}
    for key in ("name", "snapshot"):
        if getattr(args, key):
            params[key] = getattr(args, key)
    return params


def _rescale_params(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parallelism", "-p", type=int, required=True, help="the new p")
    parser.add_argument("--mode", choices=["auto", "live", "restart"], default="auto")


def _rollback_params(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--to", required=True, help="snapshot id, prefix, tag or rev~n")


def _fork_params(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--job", dest="source_job", help="fork from this job's lineage")
    source.add_argument("--application", help="fork within this application")
    parser.add_argument("--snapshot", required=True, help="snapshot id, prefix, tag, rev~n")
    parser.add_argument("--branch", required=True, help="the new branch")
    parser.add_argument("--job-name", help="the new job (default <application>-<branch>)")
    parser.add_argument("--version", type=int, help="the existing version to run (default: the "
                        "source job's, else the latest)")  # fmt: skip
    parser.add_argument(
        "--new-job", help="admins: a new version running this job (entry-point name)"
    )
    parser.add_argument("--code-version", help="admins: the new version's code version")
    parser.add_argument("--config", help="admins: JSON config of the new version")
    parser.add_argument(
        "--sinks",
        help="comma-separated registered sinks the fork writes to instead of its version's "
        "('' for none)",
    )
    parser.add_argument("--parallelism", type=int)
    parser.add_argument("--start", action="store_true", help="start the new job")


def _fork_target(args: argparse.Namespace) -> tuple[Application, Job | None]:
    if args.source_job:
        return _job_target(argparse.Namespace(job=args.source_job))
    return application_get(name=args.application), None


def _fork(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {"snapshot": args.snapshot, "branch": args.branch, "start": args.start}
    for key, name in (
        ("job_name", "job_name"),
        ("version", "version"),
        ("new_job", "job"),
        ("code_version", "code_version"),
        ("parallelism", "parallelism"),
    ):
        if getattr(args, key) is not None:
            params[name] = getattr(args, key)
    if args.sinks is not None:
        params["sinks"] = [name.strip() for name in args.sinks.split(",") if name.strip()]
    if args.config:
        try:
            params["config"] = json.loads(args.config)
        except ValueError as exc:
            raise CliError(f"--config is not JSON: {exc}") from None
    return params


def _migrate_params(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--store", help="copy the lineage to this registered store and continue there"
    )
    what.add_argument(
        "--function", help="entry-point name of a state migration (group epochal.state_migrations)"
    )
    what.add_argument("--max-parallelism", type=int, help="rehash to this M")


def _migrate(args: argparse.Namespace) -> dict[str, Any]:
    if args.store:
        return {"mode": "copy", "store": args.store}
    if args.function:
        return {"mode": "transform", "function": args.function}
    return {"mode": "rehash", "max_parallelism": args.max_parallelism}


def _align_params(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--upstream-job", required=True, help="the job whose output it reads")
    parser.add_argument("--source", default="upstream", help="its source name")
    parser.add_argument("--command", choices=["align", "catch_up", "abort"], default="align")
    parser.add_argument("--from-epoch", type=int, default=None, help="E (default: soon)")


def _align(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {
        "upstream_job": args.upstream_job,
        "source": args.source,
        "command": args.command,
    }
    if args.from_epoch is not None:
        params["from_epoch"] = args.from_epoch
    return params


def _hotswap_params(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--new-job", required=True, help="the new version's job (a fork)")
    parser.add_argument("--swap-epoch", type=int, default=None, help="S (default: soon)")
    parser.add_argument("--lead-epochs", type=int, default=3, help="S = now + this")


def _hotswap(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {"new_job": args.new_job, "lead_epochs": args.lead_epochs}
    if args.swap_epoch is not None:
        params["swap_epoch"] = args.swap_epoch
    return params


START = operation_verb(
    "start",
    "start a job from its branch head (or an empty snapshot with --from-empty)",
    _start_params,
    lambda args: {"from_empty": True} if args.from_empty else {},
)
STOP = operation_verb(
    "stop",
    "stop a job at its next epoch boundary (forced after --deadline seconds)",
    _stop_params,
    lambda args: {} if args.deadline is None else {"stop_deadline_s": args.deadline},
)
SAVEPOINT = operation_verb(
    "savepoint",
    "tag a commit of a job's branch (the head, --snapshot, or the next epoch)",
    _savepoint_params,
    _savepoint,
)
RESCALE = operation_verb(
    "rescale",
    "change a job's parallelism: live at the next epoch, or by a restart",
    _rescale_params,
    lambda args: {"parallelism": args.parallelism, "mode": args.mode},
)
ROLLBACK = operation_verb(
    "rollback",
    "move a job's branch back to an earlier snapshot and restart from it",
    _rollback_params,
    lambda args: {"to": args.to},
)
FORK = operation_verb(
    "fork",
    "new branch, application version and job from any snapshot",
    _fork_params,
    _fork,
    target=_fork_target,
)
MIGRATE = operation_verb(
    "migrate",
    "copy a job's lineage to another store, transform its state, or change M",
    _migrate_params,
    _migrate,
)
ALIGN = operation_verb(
    "align", "align a downstream job's epochs to its upstream job", _align_params, _align
)
HOTSWAP = operation_verb(
    "hotswap",
    "swap a running job for a new version (a fork of its branch) at a swap epoch",
    _hotswap_params,
    _hotswap,
)


# -- one operation, or the recent ones ----------------------------------------------------------


def _operation_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", nargs="?", help="operation id (omit to list recent ones)")
    parser.add_argument("--wait", action="store_true", help="follow it until it ends")
    parser.add_argument("--cancel", action="store_true", help="ask it to stop")
    parser.add_argument("--job", help="list: only this job's operations")
    parser.add_argument("--limit", type=int, default=20, help="list: at most this many")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to follow with --wait")


def _run_operation(args: argparse.Namespace, console: Console) -> int:
    if not args.id:
        ops = list(operation_list(job=args.job)[: args.limit])
        if console.as_json:
            console.json([operation_dict(op) for op in ops])
            return 0
        console.table(
            ["ID", "CREATED", "KIND", "TARGET", "STATE", "STEP", "ERROR"],
            [
                [
                    str(op.pk),
                    f"{op.created_at:%Y-%m-%d %H:%M:%S}",
                    op.kind,
                    op.job.name if op.job else op.application.name,
                    op.state,
                    _step(op),
                    op.error_message[:60],
                ]
                for op in ops
            ],
        )
        return 0
    op = operation_get(operation_id=args.id)
    if args.cancel:
        op = operation_cancel(operation=op)
        console.note(f"cancel requested for {op.pk} ({op.state})")
    if args.wait:
        return finish(follow(op, console.note, timeout_s=args.timeout), console)
    if not console.as_json:
        target = f"job {op.job.name}" if op.job else f"application {op.application.name}"
        console.line(f"{op.kind} operation {op.pk} on {target}, requested {op.created_at:%c}")
        for step, record in enumerate(op.phases, start=1):
            console.line(phase_line(op, step, record))
    finish(op, console)
    return 0 if op.state in ("succeeded", "pending", "running") else 1


OPERATION = Verb(
    "operation",
    "show an operation (--wait follows it), list recent ones, or --cancel one",
    _operation_arguments,
    _run_operation,
)

VERBS = (START, STOP, SAVEPOINT, RESCALE, ROLLBACK, FORK, MIGRATE, ALIGN, HOTSWAP, OPERATION)
