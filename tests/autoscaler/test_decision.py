"""The autoscaler's decision from commit histories (pure: no Django, no store)."""

from __future__ import annotations

from controlplane.autoscaler.decision import (
    HOLD,
    SCALE_DOWN,
    SCALE_UP,
    Policy,
    Sample,
    decide,
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
    loads: list[int], *, mu: float = 500.0, tick: float = 2.0, p: int = 2, policy: Policy = APPLY
) -> tuple[list[Sample], list[int]]:
    """A fluid model of the engine: one input file of `loads[k]` records arrives every `tick`
    seconds; each epoch reads one file (max_files_per_epoch=1) in records/mu busy seconds
    spread over p tasks (+0.2 s per epoch); after every commit the decision is applied from
    the next epoch on (a live rescale). Returns the samples and the epochs that rescaled."""
    arrivals = [(k * tick, n) for k, n in enumerate(loads)]
    t, read, samples, changes = 0.0, 0, [], []
    while read < len(arrivals):
        t = max(t, arrivals[read][0])
        records = arrivals[read][1]
        read += 1
        busy = records / mu
        t += busy / p + 0.2
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
    # 2000 rec/s at 500 per task and 0.7 target: 6 tasks
    assert flat[-1].parallelism == 6
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


def test_scale_down_waits_for_the_whole_down_window() -> None:
    busy = [(4, 4000, 5.5, 0)] * 4  # 5.5 busy s of 8 task-seconds: 0.69
    idle = [(4, 500, 0.5, 0)] * 6  # input fell to an eighth
    five = decide(APPLY, history(busy + idle[:5]), key_groups=128)
    assert five.action == HOLD, five.reason
    six = decide(APPLY, history(busy + idle), key_groups=128)
    assert six.action == SCALE_DOWN, six.reason
    assert 1 <= six.recommended < 4


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
    assert set(bad.problems()) == {"mode", "target_utilisation", "max_parallelism"}
