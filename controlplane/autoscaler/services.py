"""Setting policies and evaluating them: commits in (from the store), a recorded decision out,
and in apply mode an ordinary rescale operation requested (audited, the same 409 rules).

`autoscale_all` runs from Celery beat (`epochal.autoscale`, every
`EPOCHAL_AUTOSCALE_INTERVAL_S`). A job is evaluated once per new committed epoch: the head's
epoch is compared with the newest recorded decision's first, so an idle job costs one ref read.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction

from controlplane.audit.services import audit_request
from controlplane.autoscaler.decision import HOLD, MODES, Decision, Policy, decide
from controlplane.autoscaler.history import branch_samples, sample_limit
from controlplane.autoscaler.models import AutoscaleDecision, AutoscalePolicy
from controlplane.errors import Conflict, InvalidRequest
from controlplane.jobs.models import Job, JobState
from controlplane.jobs.store import job_repository

log = logging.getLogger(__name__)

#: decisions kept per job (older ones are pruned when a new one is recorded)
KEEP_DECISIONS = 500
_INT_FIELDS = (
    "min_parallelism",
    "max_parallelism",
    "scale_up_window",
    "scale_down_window",
    "cooldown_epochs",
    "metric_window",
    "catch_up_epochs",
)
_FLOAT_FIELDS = ("target_utilisation", "utilisation_min", "utilisation_max", "min_dwell_s")


def _clean(changes: Mapping[str, Any], current: Policy) -> dict[str, Any]:
    """Strict: unknown fields, wrong JSON types (no coercion) and bad values are refused."""
    unknown = sorted(set(changes) - set(AutoscalePolicy.FIELDS))
    if unknown:
        raise InvalidRequest(
            f"unknown field(s) {unknown}; allowed: {list(AutoscalePolicy.FIELDS)}",
            fields={name: ["unknown field"] for name in unknown},
        )
    wrong: dict[str, list[str]] = {}
    for name, value in changes.items():
        if name == "mode" and not isinstance(value, str):
            wrong[name] = [f"must be a string, one of {list(MODES)}"]
        elif name in _INT_FIELDS and (isinstance(value, bool) or not isinstance(value, int)):
            wrong[name] = ["must be an integer"]
        elif name in _FLOAT_FIELDS and (
            isinstance(value, bool) or not isinstance(value, int | float)
        ):
            wrong[name] = ["must be a number"]
    if wrong:
        raise InvalidRequest(f"wrong type for {sorted(wrong)}", fields=wrong)
    merged = {name: getattr(current, name) for name in AutoscalePolicy.FIELDS}
    merged.update(changes)
    for name in _FLOAT_FIELDS:
        if name in changes:
            merged[name] = float(changes[name])
    problems = Policy(**merged).problems()
    if problems:
        raise InvalidRequest(
            "invalid autoscaling policy: "
            + "; ".join(f"{k} must be {v}" for k, v in sorted(problems.items())),
            fields={k: [f"must be {v}"] for k, v in problems.items()},
        )
    return merged


def policy_set(
    *,
    job: Job,
    changes: Mapping[str, Any],
    user: AbstractBaseUser | AnonymousUser | None = None,
    source: str = "api",
) -> AutoscalePolicy:
    """Create or update `job`'s policy with `changes` (validated before anything is written)."""
    with transaction.atomic():
        row = AutoscalePolicy.objects.select_for_update().filter(job=job).first()
        current = Policy() if row is None else row.policy()
        merged = _clean(changes, current)
        if row is None:
            row = AutoscalePolicy(job=job)
        for name, value in merged.items():
            setattr(row, name, value)
        row.save()
    audit_request(
        user=user,
        action="autoscaler.policy",
        target=f"job {job.name}",
        outcome="updated",
        source=source,
        detail={"changes": dict(changes), "policy": merged},
    )
    return row


def policy_of(job: Job) -> Policy:
    row = AutoscalePolicy.objects.filter(job=job).first()
    return Policy() if row is None else row.policy()


def evaluate(job: Job, *, force: bool = False) -> AutoscaleDecision | None:
    """Decide for `job` if a new epoch committed since the last decision (or `force`); record
    the decision, and in apply mode request the rescale. None: nothing new or mode off."""
    row = AutoscalePolicy.objects.filter(job=job).first()
    if row is None or row.mode == "off":
        return None
    policy = row.policy()
    repo = job_repository(job)
    head = repo.read_ref(f"heads/{job.branch}")
    if head is None:
        return None
    last = AutoscaleDecision.objects.filter(job=job).order_by("-created_at", "-id").first()
    if not force and last is not None and last.inputs.get("head") == head.target:
        return None
    samples, key_groups = branch_samples(
        repo, job.branch, sample_limit(policy), dwell_s=policy.min_dwell_s
    )
    decision = decide(policy, samples, key_groups=key_groups)
    return record(job, policy, decision, head=head.target, key_groups=key_groups)


def record(
    job: Job, policy: Policy, decision: Decision, *, head: str, key_groups: int
) -> AutoscaleDecision:
    """Write the decision with its inputs; in apply mode, request the rescale it calls for."""
    inputs: dict[str, Any] = {
        "head": head,
        "key_groups": key_groups,
        "policy": {name: getattr(policy, name) for name in AutoscalePolicy.FIELDS},
        **decision.inputs(),
    }
    row = AutoscaleDecision(
        job=job,
        mode=policy.mode,
        action=decision.action,
        epoch=decision.epoch,
        current_parallelism=max(1, decision.current or job.parallelism),
        recommended_parallelism=max(1, decision.recommended or job.parallelism),
        reason=decision.reason,
        inputs=inputs,
        outcome="held" if decision.action == HOLD else "recommended",
    )
    if decision.action != HOLD and policy.mode == "apply":
        row.outcome, row.outcome_detail, row.operation = _apply(job, decision)
    row.save()
    _prune(job)
    return row


def _apply(job: Job, decision: Decision) -> tuple[str, str, Any]:
    from controlplane.operations.services import operation_request

    if job.state != JobState.RUNNING:
        return "refused", f"job {job.name} is {job.state}, not running", None
    try:
        requested = operation_request(
            kind="rescale",
            application=job.application,
            job=job,
            params={"parallelism": decision.recommended, "mode": "auto"},
            reason=f"autoscaler: {decision.reason}",
            via="autoscaler",
        )
    except (Conflict, InvalidRequest) as exc:
        return "refused", str(exc), None
    op = requested.operation
    return "requested", f"rescale operation {op.pk} ({op.params.get('mode')})", op


def _prune(job: Job) -> None:
    stale = (
        AutoscaleDecision.objects.filter(job=job)
        .order_by("-created_at", "-id")
        .values_list("id", flat=True)[KEEP_DECISIONS : KEEP_DECISIONS + 1]
    )
    cutoff = list(stale)
    if cutoff:
        AutoscaleDecision.objects.filter(job=job, id__lte=cutoff[0]).delete()


def autoscale_all() -> dict[str, int]:
    """Evaluate every running job with a policy (Celery beat)."""
    counts = {"evaluated": 0, "decided": 0, "requested": 0, "errors": 0}
    rows = AutoscalePolicy.objects.exclude(mode="off").filter(job__state=JobState.RUNNING)
    for row in rows.select_related("job", "job__application"):
        counts["evaluated"] += 1
        try:
            decision = evaluate(row.job)
        except Exception:
            counts["errors"] += 1
            log.warning("autoscaler: evaluating job %s failed", row.job.name, exc_info=True)
            continue
        if decision is not None:
            counts["decided"] += 1
            counts["requested"] += decision.outcome == "requested"
    return counts
