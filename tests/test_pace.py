"""The modelled machines' stalls on purpose (tfmagic.pace)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def test_a_stall_on_purpose_lengthens_that_step_of_that_task_in_every_run():
    """pace stalls: (task, step, factor) the same in every run, on top of the seeded jitter."""
    from tfmagic.errors import BadPace
    from tfmagic.pace import Pace

    plain = Pace.parse(0.1, jitter=0.4, seed=3)
    stalled = Pace.parse(0.1, jitter=0.4, seed=3, stalls=(("worker:3", 15, 12.0),))
    for step in range(30):
        for task in ("worker:0", "worker:3"):
            a, b = plain.duration(task, step), stalled.duration(task, step)
            assert b == pytest.approx(1.2 if (task, step) == ("worker:3", 15) else a), (
                "the stall has no jitter"
            )
    assert "worker:3's step 15 x12" in stalled.describe()
    with pytest.raises(BadPace, match="a stall is"):
        Pace.parse(0.1, stalls=(("worker:0", 3, 0.5),))


def test_auto_is_a_pace_to_be_measured_and_pick_keeps_the_margins():
    """pace="auto": no step time until measured; the pick asks for at most a third of the
    measured capacity, at least 1.5 x a real step's own time, rounded up to 10 ms."""
    from tfmagic.pace import Pace
    from tfmagic.training.calibrate import CEILING, FLOOR, pick

    auto = Pace.parse("auto")
    assert auto.auto and not auto.calibrated
    assert "measured on this machine" in auto.describe()
    assert Pace.parse(" AUTO ").auto
    assert not Pace.parse("40ms").auto and Pace.parse("40ms").calibrated
    assert pick(3, 150.0, 0.01) == 0.06  # 3 / (150 / 3)
    assert pick(3, 1500.0, 0.05) == 0.08  # the real step's own time rules: 1.5 x 50 ms, up to 10 ms
    assert pick(1, 10_000.0, 0.0) == FLOOR
    for workers, rate, own in ((2, 37.0, 0.013), (4, 90.0, 0.031), (8, 200.0, 0.002)):
        p = pick(workers, rate, own)
        assert workers / p <= rate / 3 + 1e-9 and p >= 1.5 * own and round(p * 100, 6) == int(round(p * 100))
    assert FLOOR < CEILING


def test_a_start_asking_the_same_pace_keeps_the_running_one():
    """Session reuse compares what was asked: "auto" matches a measured "auto", not its figure."""
    from tfmagic.pace import Pace

    measured = Pace.parse("auto")
    measured.base = 0.06
    assert Pace.parse("auto").asked == measured.asked == "auto"
    assert Pace.parse("60ms").asked != measured.asked
    assert Pace.parse("60ms").asked == Pace.parse(0.06).asked


def test_an_exponential_step_is_the_base_plus_an_exponential_time_of_the_given_mean():
    """Dutta et al.'s model, shifted: no step shorter than the base, the mean base + mean, the spread
    an exponential's (standard deviation = its mean); slowdown scales both; bad means say so."""
    import statistics

    from tfmagic.errors import BadPace
    from tfmagic.pace import Pace

    p = Pace.parse("40ms", exponential=0.08, seed=3)
    draws = [p.duration("worker:0", i) for i in range(20000)]
    assert min(draws) >= 0.04
    assert abs(statistics.fmean(draws) - 0.12) < 0.003
    assert abs(statistics.pstdev(draws) - 0.08) < 0.004
    p.set_slowdown("worker:1", 2)
    slow = [p.duration("worker:1", i) for i in range(20000)]
    assert min(slow) >= 0.08 and abs(statistics.fmean(slow) - 0.24) < 0.006
    assert "exponential time of mean 80 ms" in p.describe()
    for bad in (-0.1, float("inf"), float("nan")):
        with pytest.raises(BadPace, match="exponential is the mean"):
            Pace.parse("40ms", exponential=bad)
