"""The autoscaler's decision: commits in, one decision out. Pure (no Django, no store), so the
benchmark and the Celery task decide with the same code and tests can feed it any history.

The inputs are what every committed epoch records in its manifest stats (docs/engine.md):
``records_in``, ``busy_s`` (seconds the epoch's tasks kept a core busy, summed over tasks),
``backlog_epochs`` (epochs of input waiting after the epoch) and the commit time.

Per epoch k, over the ``metric_window`` epochs ending at k (all at the current parallelism):

* true processing rate per task ``mu = sum(records_in) / sum(busy_s)`` (Flink's autoscaler:
  records per busy second, not per wall second, so idle time does not count);
* the rate the job read ``read = sum(records_in) / wall`` (wall: from the commit before the
  window to the last commit of the window);
* input rate ``arrival = read + (backlog_k - backlog_before) * records_per_epoch / wall``: a
  growing backlog means input arrives faster than the job reads it, a shrinking one slower;
* the rate to sustain ``required = arrival + backlog_k * records_per_epoch /
  (catch_up_epochs * wall_per_epoch)`` (drain today's backlog within ``catch_up_epochs``);
* its demand ``need = required / mu`` (tasks busy all the time) and recommendation
  ``ceil(need / target_utilisation)``, clamped to ``[min_parallelism, min(max_parallelism,
  key groups)]``.

The decision never acts on one epoch's figures. Over a stabilisation window it takes the
*median* of the per-epoch demands and a one-sided confidence bound on that median (from the
median absolute deviation, see `robust`):

* **scale up** when the median utilisation ``need / p`` over the last ``scale_up_window``
  epochs is above ``utilisation_max``, to ``ceil(max(median need, newest need) /
  target_utilisation)`` (a rising load: the newest epoch has seen the most of it);
* **scale down** only when the *upper* bound of the utilisation over the last
  ``scale_down_window`` epochs is below ``utilisation_min`` and the smaller parallelism keeps
  up by that bound: to ``q = ceil(upper need / target_utilisation)``, and only if ``q < p``
  (and the newest epochs' median asks for no more than ``q``);
* else hold: between ``utilisation_min`` and ``utilisation_max`` nothing moves, however the
  epochs jitter.

After every parallelism change ``cooldown_epochs`` epochs are not measured (the epoch that
switched pays the change and the backlog built up meanwhile), and no further change is made
for ``min_dwell_s`` seconds of commit time — except a scale-up while the job cannot keep up
at all (the lower bound of its utilisation above 1), which waiting would only make worse.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

MODES = ("off", "recommend", "apply")
#: the decision's action
HOLD, SCALE_UP, SCALE_DOWN = "hold", "scale_up", "scale_down"


@dataclass(frozen=True)
class Policy:
    """A job's autoscaling policy (the defaults are the documented default policy)."""

    mode: str = "off"
    target_utilisation: float = 0.7
    min_parallelism: int = 1
    max_parallelism: int = 8
    scale_up_window: int = 2
    scale_down_window: int = 6
    cooldown_epochs: int = 2
    metric_window: int = 3
    catch_up_epochs: int = 30
    #: hold while the utilisation stays between these (Flink's utilization.min / .max)
    utilisation_min: float = 0.4
    utilisation_max: float = 0.9
    #: seconds of commit time after a parallelism change before the next one
    min_dwell_s: float = 60.0

    def problems(self) -> dict[str, str]:
        """Field -> what is wrong ({} for a valid policy)."""
        bad: dict[str, str] = {}
        if self.mode not in MODES:
            bad["mode"] = f"one of {list(MODES)}"
        if not 0.05 <= self.target_utilisation <= 1.0:
            bad["target_utilisation"] = "a number from 0.05 to 1.0"
        if self.min_parallelism < 1:
            bad["min_parallelism"] = "at least 1"
        if self.max_parallelism < self.min_parallelism:
            bad["max_parallelism"] = "at least min_parallelism"
        for name in ("scale_up_window", "scale_down_window", "metric_window", "catch_up_epochs"):
            if not 1 <= getattr(self, name) <= 1000:
                bad[name] = "an integer from 1 to 1000"
        if not 0 <= self.cooldown_epochs <= 1000:
            bad["cooldown_epochs"] = "an integer from 0 to 1000"
        if not 0.0 <= self.utilisation_min < min(1.0, self.target_utilisation):
            bad["utilisation_min"] = "a number from 0 up to (not including) target_utilisation"
        if not max(0.05, self.target_utilisation) <= self.utilisation_max <= 2.0:
            bad["utilisation_max"] = "a number from target_utilisation to 2.0"
        if not 0.0 <= self.min_dwell_s <= 86400.0:
            bad["min_dwell_s"] = "a number of seconds from 0 to 86400"
        return bad


@dataclass(frozen=True)
class Sample:
    """One committed epoch as the autoscaler sees it."""

    epoch: int
    parallelism: int
    committed_at: float  # seconds (any fixed origin)
    records_in: int = 0
    busy_s: float | None = None
    backlog_epochs: int | None = None

    @classmethod
    def from_stats(
        cls, *, epoch: int, parallelism: int, created_at: str | datetime, stats: Mapping[str, Any]
    ) -> Sample:
        """From a manifest's (or an indexed snapshot's) fields."""
        when = created_at if isinstance(created_at, datetime) else _parse(created_at)
        busy = stats.get("busy_s")
        backlog = stats.get("backlog_epochs")
        records = stats.get("records_in", 0)
        return cls(
            epoch=epoch,
            parallelism=parallelism,
            committed_at=when.timestamp(),
            records_in=int(records) if isinstance(records, int | float) else 0,
            busy_s=float(busy) if isinstance(busy, int | float) else None,
            backlog_epochs=int(backlog) if isinstance(backlog, int | float) else None,
        )


def _parse(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@dataclass(frozen=True)
class Estimate:
    """The measurements behind one epoch's recommendation."""

    epoch: int
    records_per_s_per_task: float
    read_records_per_s: float
    arrival_records_per_s: float
    required_records_per_s: float
    utilisation: float
    backlog_epochs: int
    recommended: int
    #: tasks kept busy all the time by the required rate (``required / mu``)
    need: float = 0.0


@dataclass(frozen=True)
class Decision:
    """What the autoscaler decided for a job and why; `inputs` are recorded with it."""

    action: str  # hold | scale_up | scale_down
    current: int
    recommended: int
    reason: str
    epoch: int | None = None
    estimates: tuple[Estimate, ...] = field(default_factory=tuple)

    @property
    def target(self) -> int | None:
        """The parallelism to rescale to (None: stay)."""
        return None if self.action == HOLD else self.recommended

    def inputs(self) -> dict[str, Any]:
        return {"estimates": [asdict(e) for e in self.estimates]}


def bounds(policy: Policy, key_groups: int) -> tuple[int, int]:
    """The parallelism range: the policy's, never past the number of key groups."""
    high = max(1, min(policy.max_parallelism, key_groups))
    return min(policy.min_parallelism, high), high


def parallelism_for(need: float, utilisation: float) -> int:
    """The fewest tasks that serve `need` busy tasks at no more than `utilisation` each."""
    return max(1, math.ceil(need / utilisation - 1e-9))


@dataclass(frozen=True)
class Robust:
    """A window's per-epoch figures reduced to their median and a one-sided bound each way."""

    median: float
    low: float
    high: float
    n: int


#: one-sided normal quantile of the bounds (95 %)
CONFIDENCE_Z = 1.645


def robust(values: Sequence[float], overlap: int = 1) -> Robust:
    """Median and a 95 % one-sided bound either side of it: the spread is the median absolute
    deviation scaled to a standard deviation (1.4826 MAD, which one wild epoch cannot inflate
    the way it inflates a standard deviation), the median's standard error 1.2533 sd /
    sqrt(n_eff). Consecutive values measured over `overlap` epochs each share epochs, so
    they count as ``n_eff = (n + overlap - 1) / overlap`` independent ones."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    med = statistics.median(ordered)
    mad = statistics.median(abs(v - med) for v in ordered)
    n_eff = (len(ordered) + overlap - 1) / overlap
    half = CONFIDENCE_Z * 1.2533 * 1.4826 * mad / math.sqrt(n_eff)
    return Robust(median=med, low=med - half, high=med + half, n=len(ordered))


def estimate(policy: Policy, window: Sequence[Sample], before: Sample, key_groups: int) -> Estimate:
    """The recommendation over `window` (consecutive epochs at one parallelism) following the
    commit `before`. Raises ValueError when the window cannot be measured."""
    last = window[-1]
    p = last.parallelism
    records = sum(s.records_in for s in window)
    busy = sum(s.busy_s or 0.0 for s in window)
    wall = last.committed_at - before.committed_at
    if any(s.busy_s is None for s in window):
        raise ValueError("an epoch records no busy time (engine before busy_s)")
    if busy <= 0 or wall <= 0 or records <= 0:
        raise ValueError("no records or no busy time in the window")
    mu = records / busy
    read = records / wall
    per_epoch = last.records_in  # a waiting epoch of input is like the newest one read
    backlog = last.backlog_epochs or 0
    growth = backlog - (before.backlog_epochs or 0)
    arrival = max(0.0, read + growth * per_epoch / wall)
    wall_per_epoch = wall / len(window)
    required = arrival + backlog * per_epoch / (policy.catch_up_epochs * wall_per_epoch)
    low, high = bounds(policy, key_groups)
    wanted = parallelism_for(required / mu, policy.target_utilisation)
    return Estimate(
        epoch=last.epoch,
        records_per_s_per_task=round(mu, 3),
        read_records_per_s=round(read, 3),
        arrival_records_per_s=round(arrival, 3),
        required_records_per_s=round(required, 3),
        utilisation=round(busy / (p * wall), 4),
        backlog_epochs=backlog,
        recommended=max(low, min(high, wanted)),
        need=round(required / mu, 4),
    )


def _last_change(ordered: Sequence[Sample]) -> Sample | None:
    """The newest commit at another parallelism than the newest one's (None: none seen)."""
    p = ordered[-1].parallelism
    return next((s for s in reversed(ordered) if s.parallelism != p), None)


def decide(policy: Policy, samples: Sequence[Sample], *, key_groups: int) -> Decision:
    """The decision after the newest of `samples` (a branch's commits, oldest first)."""
    if not samples:
        return Decision(HOLD, 0, 0, "no committed epochs yet")
    ordered = sorted(samples, key=lambda s: s.epoch)
    last = ordered[-1]
    p = last.parallelism
    low, high = bounds(policy, key_groups)
    # Outside the bounds (a policy changed, M shrank): move into them first.
    if p > high or p < low:
        target = min(high, max(low, p))
        action = SCALE_DOWN if target < p else SCALE_UP
        return Decision(
            action,
            p,
            target,
            f"parallelism {p} is outside [{low}, {high}] (policy bounds, key groups {key_groups})",
            last.epoch,
        )
    # The epochs since the last parallelism change.
    since = 0
    for s in reversed(ordered):
        if s.parallelism != p:
            break
        since += 1
    steady = ordered[len(ordered) - since :]
    first_measured = policy.cooldown_epochs if since < len(ordered) else 0
    measured = steady[first_measured:]
    if since < len(ordered) and since <= policy.cooldown_epochs:
        return Decision(
            HOLD,
            p,
            p,
            f"cooldown: {since} of {policy.cooldown_epochs + 1} epochs at parallelism {p} "
            "since the last change",
            last.epoch,
        )
    need = policy.metric_window
    estimates: list[Estimate] = []
    span = max(policy.scale_up_window, policy.scale_down_window)
    # measured[i - need + 1 .. i] with the commit before it: one estimate per epoch i.
    offset = len(ordered) - len(measured)
    for i in range(max(need - 1, len(measured) - span), len(measured)):
        start = i - need + 1
        if start + offset < 1:
            continue  # the first commit has nothing before it to measure from
        window = measured[start : i + 1]
        try:
            estimates.append(estimate(policy, window, ordered[start + offset - 1], key_groups))
        except ValueError as exc:
            return Decision(HOLD, p, p, f"epoch {window[-1].epoch}: {exc}", last.epoch)
    if not estimates or estimates[-1].epoch != last.epoch:
        return Decision(
            HOLD,
            p,
            p,
            f"measuring: {len(measured)} of {need} epochs after the window start",
            last.epoch,
            tuple(estimates),
        )
    return _judge(policy, ordered, tuple(estimates), low, high)


def _judge(
    policy: Policy, ordered: Sequence[Sample], estimates: tuple[Estimate, ...], low: int, high: int
) -> Decision:
    """The decision from the per-epoch estimates at the current parallelism (module doc)."""
    last = ordered[-1]
    p = last.parallelism
    target = policy.target_utilisation

    def clamp(n: int) -> int:
        return max(low, min(high, n))

    up_window = estimates[-policy.scale_up_window :]
    down_window = estimates[-policy.scale_down_window :]
    up = robust([e.need for e in up_window], policy.metric_window)
    down = robust([e.need for e in down_window], policy.metric_window)
    newest = estimates[-1]
    point = clamp(parallelism_for(up.median, target))
    # a rising load: the newest epoch has seen the most of it (the median lags a step)
    rising = max(up.median, newest.need)
    catch_up = clamp(parallelism_for(rising, target))
    why = (
        f"median utilisation {up.median / p:.2f} over the last {up.n} epochs "
        f"(holds from {policy.utilisation_min:.2f} to {policy.utilisation_max:.2f}, "
        f"target {target:.2f}), input {newest.arrival_records_per_s:.0f} rec/s, "
        f"{newest.records_per_s_per_task:.0f} rec/s per busy task, "
        f"backlog {newest.backlog_epochs} epochs"
    )
    wants: tuple[str, int, str] | None = None
    if len(up_window) == policy.scale_up_window and up.median / p > policy.utilisation_max:
        if catch_up > p:
            wants = (
                SCALE_UP,
                catch_up,
                f"{why}: above {policy.utilisation_max:.2f}; {rising:.2f} busy tasks "
                f"need {catch_up} at the target",
            )
    elif len(down_window) == policy.scale_down_window and down.high / p < policy.utilisation_min:
        # The smaller parallelism must keep up by the bound, and by the newest epochs too.
        demand = max(down.high, up.median)
        smaller = clamp(parallelism_for(demand, target))
        if smaller < p:
            wants = (
                SCALE_DOWN,
                smaller,
                f"{why}: the last {down.n} epochs' utilisation is at most "
                f"{down.high / p:.2f} (95 % bound), below {policy.utilisation_min:.2f}; "
                f"{smaller} tasks keep up at {demand / smaller:.2f} by that bound",
            )
    if wants is None:
        return Decision(
            HOLD,
            p,
            point,
            f"{why}: stays at {p} (demand {up.median:.2f} busy tasks, 95 % bounds "
            f"{down.low:.2f} to {down.high:.2f} over the last {down.n} epochs)",
            last.epoch,
            estimates,
        )
    action, to, reason = wants
    change = _last_change(ordered)
    # A job that demonstrably cannot keep up (utilisation above 1 by the lower bound) is not
    # held: waiting would only grow its backlog.
    behind = action == SCALE_UP and up.low / p > 1.0
    if (
        change is not None
        and not behind
        and last.committed_at - change.committed_at < policy.min_dwell_s
    ):
        dwelt = last.committed_at - change.committed_at
        return Decision(
            HOLD,
            p,
            to,
            f"{reason}; but it holds: {dwelt:.0f} of min_dwell_s {policy.min_dwell_s:g} s "
            "since the last change",
            last.epoch,
            estimates,
        )
    return Decision(action, p, to, reason, last.epoch, estimates)
