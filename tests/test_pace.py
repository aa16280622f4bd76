"""The modelled machines' stalls on purpose (tfmagic.pace)."""

from __future__ import annotations

import pytest

from .conftest import magic_refusal

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
    assert Pace.parse("auto").asked == measured.asked == ("auto", 0.0)
    assert Pace.parse("60ms").asked != measured.asked
    assert Pace.parse("60ms").asked == Pace.parse(0.06).asked
    assert Pace.parse("60ms", jitter=0.1).asked != Pace.parse("60ms").asked, "a new jitter is a new model"


def test_jitter_on_the_start_line_spreads_the_pace_or_says_what_to_give():
    from tfmagic.backends import ClusterRequest, check
    from tfmagic.errors import BadClusterShape

    request = ClusterRequest(ps=1, workers=2, pace="400ms", jitter=0.1)
    check(request)
    assert request.paced().jitter == 0.1 and request.paced().base == 0.4
    assert ClusterRequest(ps=1, workers=2, pace="400ms").paced() == "400ms"
    with pytest.raises(BadClusterShape, match="give --pace too"):
        check(ClusterRequest(ps=1, workers=2, jitter=0.1))
    for line, said in (
        ("start --ps 1 --workers 2 --pace 400ms --jitter lots", "--jitter is a number such as 0.1"),
        ("start --ps 1 --workers 2 --pace 400ms --jitter 5", "--jitter is 0 to 2"),
        ("start --ps 1 --workers 2 --jitter 0.1", "give --pace too"),
    ):
        message = magic_refusal(line)
        assert said in message and "\n" not in message, message


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


def _steps(task, reads_updates, pace=0.06):
    """A worker's paced records: (global step read, update it became) per local step."""
    from tfmagic.metrics import StepRecord

    return [
        StepRecord(
            task,
            read,
            10.0 + i * pace,
            10.0 + (i + 1) * pace,
            1.0,
            local_step=i,
            update=update,
            staleness=update - 1 - read,
            compute=0.001,
            transfer=0.001,
            apply=0.001,
            paced=pace,
        )
        for i, (read, update) in enumerate(reads_updates)
    ]


def test_updates_landing_between_a_workers_apply_and_its_next_read_count_for_none_of_its_gradients():
    """The model applies and reads again at one instant; an update that lands in the real call's gap is in
    the parameters read next, so no gradient of that worker counts it: the staleness falls short by it."""
    from tfmagic.pace import Pace, pace_notes, updates_while_applying

    # worker:0 updates 3, 6, 9, ...: it reads right after each of its updates (the model's instant) ...
    model = _steps("worker:0", [(3 * i, 3 * i + 3) for i in range(30)])
    assert updates_while_applying(model) == (0, 2 * 29)
    assert pace_notes(Pace(0.06), model, instant_updates=True) == []
    # ... or one update by another worker lands in that gap every other step: staleness 2 then 1
    gap = _steps("worker:0", [(3 * i + (i % 2 and 1), 3 * i + 3) for i in range(30)])
    unseen, others = updates_while_applying(gap)
    assert (unseen, others) == (15, 58)
    assert sum(r.staleness for r in gap[1:]) == others - unseen
    notes = pace_notes(Pace(0.06), gap, instant_updates=True)
    assert len(notes) == 1 and notes[0].startswith("staleness below the model's: 26% of the other workers")
    assert "could not keep" not in notes[0], "an explanation, not a failed pace: the lesson checks staleness"
    assert pace_notes(Pace(0.06), gap) == [], "sync has no staleness to explain"
    # a step lost in between (local steps 4 and 6) or one past the run's last update is not a gap
    assert updates_while_applying([gap[3], gap[5]]) == (0, 0)
    assert updates_while_applying(_steps("worker:1", [(0, 3), (3, -1)])) == (0, 0)


def test_steps_over_their_modelled_time_say_the_pace_was_not_kept_and_what_would_be():
    from tfmagic.pace import Pace, pace_notes

    recs = _steps("worker:0", [(3 * i, 3 * i + 3) for i in range(20)])
    for r in recs[:5]:
        r.end = r.start + 0.1  # 5 of 20 steps at 100 ms of a 60 ms pace: 25 % late
        r.compute = 0.08
    (note,) = pace_notes(Pace(0.06), recs, instant_updates=True)
    # 5 steps 40 ms over, 20 x 60 ms modelled: 200 / 1200 = 17 % more time than the model's
    assert note.startswith("the machine could not keep the 60 ms pace: 25% of the steps took longer")
    assert "adding 17% to the run's modelled time" in note, note
    assert note.endswith("A pace of 123 ms or more would work"), note  # 1.5 x 82 ms


def test_steps_a_little_late_that_hardly_move_the_runs_time_keep_the_pace():
    """Exponential step times model many steps of a few milliseconds; a real step late by a scheduling
    tick is over 25 % late there, yet the run's figures move by a fraction of a percent."""
    from tfmagic.pace import Pace, pace_notes

    recs = _steps("worker:0", [(3 * i, 3 * i + 3) for i in range(40)])
    for i, r in enumerate(recs):
        r.paced = 0.01 if i % 4 == 0 else 0.2  # a quarter of the steps modelled at 10 ms ...
        r.end = r.start + (0.015 if i % 4 == 0 else 0.2)  # ... each 5 ms (50 %) late
    assert pace_notes(Pace(0.06), recs) == [], (
        "5 ms x 10 over 6.1 s modelled: 0.8 % more, the model's figures"
    )
    for r in recs[1::4]:
        r.end = r.start + 0.26  # and a quarter 30 % late on 200 ms: 10 x 60 ms, 11 % more
    (note,) = pace_notes(Pace(0.06), recs)
    assert "50% of the steps took longer than modelled, adding 11% to the run's modelled time" in note, note
