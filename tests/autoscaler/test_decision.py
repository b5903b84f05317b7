"""The autoscaler's decision from commit histories (pure: no Django, no store)."""

from __future__ import annotations

import random

import pytest

from controlplane.autoscaler.decision import (
    HOLD,
    SCALE_DOWN,
    SCALE_UP,
    Policy,
    Sample,
    decide,
    robust,
)

APPLY = Policy(mode="apply")


def history(
    epochs: list[tuple[int, int, float, int]], *, interval: float = 2.0, start: int = 1
) -> list[Sample]:
    """(parallelism, records, busy seconds summed over tasks, backlog) per epoch, committed
    every `interval` seconds."""
    return [
        Sample(
            epoch=start + i,
            parallelism=p,
            committed_at=(start + i) * interval,
            records_in=records,
            busy_s=busy,
            backlog_epochs=backlog,
        )
        for i, (p, records, busy, backlog) in enumerate(epochs)
    ]


def test_an_underused_job_shrinks_to_its_need_and_a_job_at_its_need_holds() -> None:
    # p=2, 1000 records per 2 s epoch in 1 busy second: utilisation 0.25; one task would be
    # at 0.5 (< 0.7 target)
    quiet = history([(2, 1000, 1.0, 0)] * 10)
    decision = decide(APPLY, quiet, key_groups=128)
    assert (decision.action, decision.current, decision.recommended) == (SCALE_DOWN, 2, 1)
    assert decision.estimates[-1].utilisation == 0.25
    at_need = decide(Policy(mode="apply", min_parallelism=2), quiet, key_groups=128)
    assert (at_need.action, at_need.recommended) == (HOLD, 2)
    assert at_need.target is None


def simulate(
    loads: list[int],
    *,
    mu: float = 500.0,
    tick: float = 2.0,
    p: int = 2,
    policy: Policy = APPLY,
    jitter: float = 0.0,
    seed: int = 0,
    overhead: float = 0.2,
) -> tuple[list[Sample], list[int]]:
    """A fluid model of the engine: one input file of `loads[k]` records arrives every `tick`
    seconds; each epoch reads one file (max_files_per_epoch=1) in records/mu busy seconds
    spread over p tasks (+`overhead` s per epoch); after every commit the decision is applied
    from the next epoch on (a live rescale). With `jitter`, each epoch's per-record cost and
    overhead are scaled by 1 +- jitter (uniform, seeded). Returns the samples and the epochs
    that rescaled."""
    rng = random.Random(seed)
    arrivals = [(k * tick, n) for k, n in enumerate(loads)]
    t, read, samples, changes = 0.0, 0, [], []
    while read < len(arrivals):
        t = max(t, arrivals[read][0])
        records = arrivals[read][1]
        read += 1
        busy = records / mu * (1 + jitter * rng.uniform(-1, 1))
        t += busy / p + overhead * (1 + jitter * rng.uniform(-1, 1))
        backlog = sum(1 for at, _ in arrivals[read:] if at <= t)
        samples.append(Sample(len(samples) + 1, p, t, records, busy, backlog))
        decision = decide(policy, samples, key_groups=128)
        if decision.target is not None:
            changes.append(len(samples) + 1)
            p = decision.target
    return samples, changes


def test_a_load_step_scales_up_within_five_epochs_without_flapping_and_back_down() -> None:
    low, high = 1000, 4000  # 500 and 2000 records/s; 500 records per busy task-second
    samples, changes = simulate([low] * 15 + [high] * 30 + [low] * 30)
    step = next(s.epoch for s in samples if s.records_in == high)
    first_up = min(c for c in changes if c > step)
    assert first_up - step <= 5, changes
    at = {s.epoch: s.parallelism for s in samples}
    assert at[first_up] > 2
    high_epochs = [s for s in samples if s.records_in == high and s.epoch >= first_up]
    flat = high_epochs[len(high_epochs) // 2 :]
    assert len({s.parallelism for s in flat}) == 1, [(s.epoch, s.parallelism) for s in flat]
    # 2000 rec/s at 500 per task: 4 busy tasks, 6 at the 0.7 target; 5 (0.8) is inside the
    # hold band, and keeps up
    assert flat[-1].parallelism in (5, 6)
    assert flat[-1].backlog_epochs <= 1
    assert samples[-1].parallelism < flat[-1].parallelism  # back down once the load fell
    assert samples[-1].backlog_epochs == 0


def test_a_growing_backlog_scales_up_after_the_up_window_and_not_before() -> None:
    steady = [(2, 1000, 2.0, 0)] * 6  # 2 busy s of 4: utilisation 0.5, recommendation 2
    # 4x input: each epoch reads what its 2 tasks manage while the backlog grows
    loaded = [(2, 2000, 4.0, b) for b in (1, 2, 3)]
    first = decide(APPLY, history(steady + loaded[:1]), key_groups=128)
    assert first.action == HOLD, first.reason  # one epoch above: the up window wants two
    second = decide(APPLY, history(steady + loaded[:2]), key_groups=128)
    assert second.action == SCALE_UP, second.reason
    assert second.recommended > 2
    assert second.estimates[-1].backlog_epochs == 2
    assert "backlog" in second.reason


def test_keyed_jobs_never_scale_past_the_key_groups() -> None:
    loaded = [(2, 1000, 2.0, 0)] * 3 + [(2, 2000, 4.0, b) for b in (1, 2, 3, 4)]
    decision = decide(APPLY, history(loaded), key_groups=4)
    assert decision.action == SCALE_UP
    assert decision.recommended == 4
    capped = decide(Policy(mode="apply", max_parallelism=3), history(loaded), key_groups=128)
    assert capped.recommended == 3


def test_scale_down_carries_the_busy_epochs_of_its_window_in_its_bound() -> None:
    busy = [(4, 4000, 5.5, 0)] * 4  # 5.5 busy s of 8 task-seconds: 0.69
    idle = [(4, 500, 0.5, 0)] * 8  # input fell to an eighth
    two = decide(APPLY, history(busy + idle[:2]), key_groups=128)
    assert two.action == HOLD, two.reason  # most of the window is still busy
    five = decide(APPLY, history(busy + idle[:5]), key_groups=128)
    # the median is idle, but the bound still counts the busy epochs: a cautious step
    assert five.action == SCALE_DOWN and five.recommended >= 2, five.reason
    eight = decide(APPLY, history(busy + idle), key_groups=128)
    assert (eight.action, eight.recommended) == (SCALE_DOWN, 1), eight.reason


def test_cooldown_after_a_change_measures_nothing() -> None:
    before = [(2, 1000, 2.0, 0)] * 5
    after = [(4, 3000, 3.0, 0)] * 2
    decision = decide(APPLY, history(before + after), key_groups=128)
    assert decision.action == HOLD
    assert decision.reason.startswith("cooldown")
    # after the cooldown (2 epochs) and a full metric window it measures at p=4 again
    later = decide(APPLY, history(before + [(4, 3000, 3.0, 0)] * 6), key_groups=128)
    assert not later.reason.startswith("cooldown")
    assert later.estimates and later.estimates[-1].utilisation == round(3.0 / (4 * 2.0), 4)


def test_no_busy_time_recorded_holds_with_the_reason() -> None:
    samples = [Sample(epoch=e, parallelism=2, committed_at=e, records_in=10) for e in range(1, 8)]
    decision = decide(APPLY, samples, key_groups=128)
    assert decision.action == HOLD
    assert "busy time" in decision.reason


def test_parallelism_outside_the_bounds_moves_into_them() -> None:
    decision = decide(
        Policy(mode="apply", max_parallelism=2), history([(5, 10, 1, 0)] * 3), key_groups=128
    )
    assert (decision.action, decision.recommended) == (SCALE_DOWN, 2)


def test_policy_problems_name_the_field() -> None:
    assert Policy().problems() == {}
    bad = Policy(mode="auto", target_utilisation=2, min_parallelism=3, max_parallelism=2)
    assert set(bad.problems()) == {
        "mode",
        "target_utilisation",
        "max_parallelism",
        "utilisation_max",  # below the (bad) target
    }


@pytest.mark.parametrize("utilisation", [0.5, 0.55, 0.6, 0.65])
def test_a_cost_jittering_by_30_percent_never_changes_parallelism_twice_in_a_flat_load(
    utilisation: float,
) -> None:
    # p=2 busy `utilisation` of the time on average; every epoch's per-record cost and
    # overhead drawn from 1 +- 0.3 (seeded); no dwell time, so only the decision rule holds
    records = int(utilisation * 2 * 2.0 * 500)
    policy = Policy(mode="apply", min_dwell_s=0)
    for seed in range(40):
        samples, changes = simulate(
            [records] * 40, jitter=0.3, seed=seed, overhead=0.3, policy=policy
        )
        assert len(changes) <= 1, (seed, [(s.epoch, s.parallelism) for s in samples])


def test_without_a_hold_band_the_same_jitter_flaps() -> None:
    # the test above can fail: a band squeezed onto the target acts on the noise
    policy = Policy(mode="apply", min_dwell_s=0, utilisation_min=0.69, utilisation_max=0.7)
    records = int(0.65 * 2 * 2.0 * 500)
    flapping = 0
    for seed in range(40):
        _, changes = simulate([records] * 40, jitter=0.3, seed=seed, overhead=0.3, policy=policy)
        flapping += len(changes) > 1
    assert flapping >= 10


def test_robust_takes_the_median_and_one_wild_epoch_barely_moves_it() -> None:
    calm = robust([1.0, 1.1, 0.9, 1.0, 1.05, 0.95])
    assert calm.median == 1.0 and calm.low < 1.0 < calm.high
    wild = robust([1.0, 1.1, 0.9, 1.0, 1.05, 9.0])
    assert wild.median == pytest.approx(1.025)
    assert wild.high < 1.2  # a mean +- sd would have jumped past 2
    spread = robust([0.5, 1.5, 0.6, 1.4, 1.0, 1.0])
    assert spread.high - spread.low > calm.high - calm.low
    # values measured over overlapping windows count as fewer independent ones
    assert robust([0.9, 1.1, 1.0], overlap=3).high > robust([0.9, 1.1, 1.0]).high


def test_scale_down_waits_for_the_bound_not_the_point_estimate() -> None:
    # p=4, per-epoch estimates (metric window 1); the down window's median demand is 0.75
    # busy tasks (utilisation 0.19): at the median 2 tasks would do (0.75 / 0.7 -> 2)
    policy = Policy(mode="apply", metric_window=1)
    steady = history([(4, 1500, 1.5, 0)] * 9)
    down = decide(policy, steady, key_groups=128)
    assert (down.action, down.recommended) == (SCALE_DOWN, 2), down.reason
    assert "95 % bound" in down.reason
    # the same median (0.75) with epochs from 0.2 to 1.4 busy tasks: by the upper bound of
    # the median 2 tasks might not keep up, so it steps down only to 3
    jumpy = history([(4, 1500, 1.5, 0)] * 3 + [(4, 1500, b, 0) for b in (0.4, 2.8, 1.5) * 2])
    cautious = decide(policy, jumpy, key_groups=128)
    assert (cautious.action, cautious.recommended) == (SCALE_DOWN, 3), cautious.reason


def test_no_change_within_min_dwell_s_of_the_last_one() -> None:
    # a change to p=4 at t=10 s, then a load that clearly wants fewer tasks
    before = [(2, 1000, 2.0, 0)] * 5
    after = [(4, 500, 0.4, 0)] * 12  # utilisation 0.05
    samples = history(before + after)  # 2 s apart: the last is 24 s after the change
    held = decide(Policy(mode="apply", min_dwell_s=60), samples, key_groups=128)
    assert held.action == HOLD and held.target is None
    assert "min_dwell_s" in held.reason and held.recommended < 4
    free = decide(Policy(mode="apply", min_dwell_s=20), samples, key_groups=128)
    assert free.action == SCALE_DOWN


def test_policy_band_and_dwell_are_validated() -> None:
    assert Policy(utilisation_min=0.0, utilisation_max=2.0, min_dwell_s=0).problems() == {}
    bad = Policy(target_utilisation=0.8, utilisation_min=0.8, utilisation_max=0.75, min_dwell_s=-1)
    assert set(bad.problems()) == {"utilisation_min", "utilisation_max", "min_dwell_s"}
