"""What the dashboard plots are computed from: pure logic, no processes."""

import time

import pytest

from tfmagic.dashdata import MAJOR, DownsampledSeries, RollingRate, RunTrace, place_event
from tfmagic.metrics import Event, GlobalStep, History, StepRecord

pytestmark = pytest.mark.unit


def test_rolling_rate_counts_only_the_window():
    r = RollingRate(window=2.0)
    for t in (0.1, 0.5, 1.0, 1.5, 1.9):
        r.add("worker:0", t)
    assert r.rate("worker:0", now=2.0) == 2.5
    assert r.rate("worker:0", now=3.0) == 1.0  # only 1.5 and 1.9 remain
    assert r.rate("worker:0", now=10.0) == 0.0
    assert r.rate("worker:9", now=1.0) == 0.0


def test_rolling_rate_shows_a_straggler_and_a_dead_worker():
    r = RollingRate(window=1.0)
    for i in range(100):
        r.add("worker:0", i * 0.01)  # 100 steps/s
    for i in range(10):
        r.add("worker:1", i * 0.1)  # 10 steps/s
    assert r.rate("worker:0", 0.999) == pytest.approx(100, rel=0.02)
    assert r.rate("worker:1", 0.999) == pytest.approx(10, rel=0.1)
    assert r.rate("worker:1", 5.0) == 0.0


def test_downsampled_series_is_bounded_and_keeps_the_whole_range():
    s = DownsampledSeries(max_points=100)
    for i in range(100_000):
        s.append(i, 2.0 * i)
    assert len(s) <= 100
    assert s.xs[0] < 1000 and s.xs[-1] > 98_000, "old and new points both stay in view"
    assert all(y == pytest.approx(2 * x) for x, y in zip(s.xs, s.ys)), "pairs are merged by averaging"
    assert s.xs == sorted(s.xs)


def test_downsampling_averages_noise():
    s = DownsampledSeries(max_points=10)
    for i in range(1000):
        s.append(i, 1.0 if i % 2 else 3.0)
    assert all(y == pytest.approx(2.0, abs=0.02) for y in s.ys[:-1])
    assert sum(s.ws) + len(s._pending) == 1000, "every raw point is counted once"


def test_event_placement_in_time_and_steps():
    origin = 1000.0
    e = Event(time=1012.5, kind="slow", task="worker:1", detail="x4", step=37)
    m = place_event(e, origin, last_step=50)
    assert (m.t, m.step, m.label) == (12.5, 37, "worker:1 x4")
    e2 = Event(time=1013.0, kind="kill", task="worker:2")
    m2 = place_event(e2, origin, last_step=50)
    assert (m2.t, m2.step) == (13.0, 50), "an event without a step goes where the run is"
    assert "kill" in MAJOR and "dropped" not in MAJOR


def test_run_trace_is_incremental_and_bounded():
    h = History("sync")
    tr = RunTrace(h, origin=0.0, max_points=50, max_marks=20)
    for i in range(5000):
        g = GlobalStep(i + 1, float(i), 1.0 / (i + 1))
        tr.on_global(g)
    tr.on_event(Event(0.5, "slow", "worker:1", "x4", step=1))
    for i in range(100):
        tr.on_event(Event(float(i), "dropped", "worker:2", step=i))
    snap = tr.copy()
    drops = [m for m in snap["marks"] if m.kind == "dropped"]
    assert len(snap["step"][0]) <= 50 and len(drops) == 20
    assert [m.step for m in drops] == list(range(80, 100)), "the newest drops are kept"
    # a hundred dropped gradients do not push the slow mark off the plot
    assert [(m.kind, m.step) for m in snap["marks"] if m.kind != "dropped"] == [("slow", 1)]
    assert snap["dropped"] == 100 and snap["updates"] == 5000


def test_history_throughput_and_dropped():
    h = History("sync")
    t = time.time()
    for i in range(10):
        h.add_step(StepRecord("worker:0", i, t + i, t + i + 0.5, 1.0, mode="sync", examples=32))
        h.add_step(
            StepRecord(
                "worker:1",
                i,
                t + i,
                t + i + 0.9,
                1.0,
                mode="sync",
                examples=32,
                applied=i % 2 == 0,
                dropped=i % 2 == 1,
            )
        )
    tp = h.throughput()
    assert tp["worker:0"]["steps"] == 10
    assert tp["worker:0"]["examples_per_s"] == pytest.approx(32 * tp["worker:0"]["steps_per_s"])
    assert h.dropped() == {"worker:1": 5}


def test_frames_redraw_the_axes_rarely_and_keep_all_data_in_view():
    """A usual frame redraws only the lines (9 ms here); a change of axis limits redraws
    everything (60-140 ms, holding the Python lock the training threads need). Limits grow in
    few large steps: over a 20,000-update run drawn 40 times, the axes are redrawn a handful
    of times, and every frame still shows all the data."""
    from tfmagic.dashboard import Dashboard

    h = History("async", run="async", workers=["worker:0"])
    dash = Dashboard(None, runs=[h], refresh=0.5)
    t0 = time.time()
    for frame in range(40):
        for i in range(frame * 500, (frame + 1) * 500):
            loss = 2.0 / (1 + i / 50)  # falls through four decades
            h.add_step(StepRecord("worker:0", i, t0 + i * 0.005, t0 + i * 0.005, loss, mode="async"))
            h.add_global(GlobalStep(i + 1, t0 + i * 0.005, loss))
        dash.draw()
        for ax in dash._axes:  # every plotted point is inside its axes
            (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
            for line in ax.get_lines():
                xs, ys = line.get_data()
                if len(xs) and line.get_transform() == ax.transData:
                    assert x0 <= min(xs) and max(xs) <= x1 and y0 <= min(ys) and max(ys) <= y1, (frame, ax)
    assert dash.frames == 40
    assert dash.full_draws <= 12, dash.full_draws


def test_a_dashboard_opened_after_a_run_shows_all_of_it():
    """%tf_dashboard on a run that trained a minute ago: its loss over time starts at 0 s, in view."""
    from tfmagic.dashboard import Dashboard

    h = History("sync", run="sync", workers=["worker:0"])
    h.started_at = t0 = time.time() - 60
    for i in range(200):
        h.add_global(GlobalStep(i + 1, t0 + i * 0.1, 1.0 / (i + 1)))
    h.add_event(Event(t0 + 5, "slow", "worker:0", "x4", step=50))
    dash = Dashboard(None, runs=[h])
    dash.draw()
    _, _, ax_time = dash._axes
    (line,) = [ln for ln in ax_time.get_lines() if ln.get_label() == "sync"]
    xs = line.get_data()[0]
    assert min(xs) == pytest.approx(0.0, abs=0.2) and max(xs) <= ax_time.get_xlim()[1], (min(xs), max(xs))
