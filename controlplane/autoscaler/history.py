"""The autoscaler's view of a branch: its newest epoch commits as `Sample`s, read from the
store (no Django: the benchmark uses it too)."""

from __future__ import annotations

from controlplane.autoscaler.decision import Policy, Sample
from snapshots_store import Repository

#: commits read at most to find the last parallelism change within a policy's dwell time
MAX_DWELL_SAMPLES = 2000


def branch_samples(
    repo: Repository, branch: str, limit: int, *, dwell_s: float = 0.0
) -> tuple[list[Sample], int]:
    """The newest `limit` epoch commits of `branch`'s first-parent history, oldest first, and
    the lineage's key groups (M). Stops at a commit that processed nothing and is not a
    rescale (rollback, fork, migration, initial): what came before is another history.

    With `dwell_s`, reads on past `limit` (up to `MAX_DWELL_SAMPLES`) while every commit so
    far is at the newest one's parallelism and committed less than `dwell_s` before it, so a
    parallelism change within the dwell time is always among the samples."""
    head = repo.read_ref(f"heads/{branch}")
    if head is None:
        return [], 0
    samples: list[Sample] = []
    key_groups = 0
    sid: str | None = head.target

    def more() -> bool:
        if len(samples) < limit:
            return True
        if not dwell_s or len(samples) >= MAX_DWELL_SAMPLES:
            return False
        newest, oldest = samples[0], samples[-1]
        return (
            oldest.parallelism == newest.parallelism
            and newest.committed_at - oldest.committed_at < dwell_s
        )

    while sid is not None and more():
        manifest = repo.read_manifest(sid)
        key_groups = key_groups or manifest.max_parallelism
        if "records_in" in manifest.stats:
            samples.append(
                Sample.from_stats(
                    epoch=manifest.epoch,
                    parallelism=manifest.parallelism,
                    created_at=manifest.created_at,
                    stats=manifest.stats,
                )
            )
        elif manifest.kind != "rescale":
            break
        sid = manifest.parents[0] if manifest.parents else None
    samples.reverse()
    return samples, key_groups


def sample_limit(policy: Policy) -> int:
    """Commits one decision needs: the cooldown, the metric window and the longest
    stabilisation window, plus the commits before them."""
    return (
        policy.cooldown_epochs
        + policy.metric_window
        + max(policy.scale_up_window, policy.scale_down_window)
        + 2
    )
