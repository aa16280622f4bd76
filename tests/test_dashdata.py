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
        for ax in dash.frame.axes:  # every plotted point is inside its axes
            (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
            for line in ax.get_lines():
                xs, ys = line.get_data()
                if len(xs) and line.get_transform() == ax.transData:
                    assert x0 <= min(xs) and max(xs) <= x1 and y0 <= min(ys) and max(ys) <= y1, (frame, ax)
    assert dash.frames == 40
    assert dash.axes_draws <= 12, dash.axes_draws
    assert dash.full_draws == 1, "after the first frame only the axes that changed are redrawn"


def test_a_dashboard_opened_after_a_run_shows_all_of_it():
    """%tf_dashboard on a run that trained a minute ago: its loss over time starts at 0 s, in view."""
    from tfmagic.dashboard import Dashboard

    h = History("sync", run="sync", workers=["worker:0"])
    h.started_at = t0 = time.time() - 60
    for i in range(200):
        h.add_global(GlobalStep(i + 1, t0 + i * 0.1, 1.0 / (i + 1)))
    h.add_event(Event(t0 + 5, "slow", "worker:0", "x4", step=50))
    dash = Dashboard(None, runs=[h], x="seconds")
    dash.draw()
    ax_time = dash.frame.ax["loss"]
    (line,) = [ln for ln in ax_time.get_lines() if ln.get_label() == "sync"]
    xs = line.get_data()[0]
    assert min(xs) == pytest.approx(0.0, abs=0.2) and max(xs) <= ax_time.get_xlim()[1], (min(xs), max(xs))


def _sync_history(workers=3, updates=100, batch=32, warm_end=None, slow=None, t0=1000.0):
    """A sync run as the engine records it: each update's worker steps, then the update."""
    h = History("sync", run="sync", workers=[f"worker:{i}" for i in range(workers)])
    h.started_at = t0 - 1.0
    for t in range(updates):
        start = t0 + t * 0.1
        ends = {f"worker:{i}": start + (0.08 if f"worker:{i}" == slow else 0.02) for i in range(workers)}
        barrier = max(ends.values())
        for task, end in ends.items():
            h.add_step(
                StepRecord(
                    task, t, start, end, 1.0, mode="sync", examples=batch, wait=barrier - end, warmup=t == 0
                )
            )
        h.add_global(GlobalStep(t + 1, barrier + 0.001, 2.0 / (t + 2)))
        if t == 0:
            h.warmup_ended_at = barrier + 0.001 if warm_end is None else warm_end
    return h


def test_loss_curves_stay_raw_unless_smoothing_is_asked_and_then_say_so():
    from tfmagic.dashboard import Dashboard

    s = DownsampledSeries(max_points=10, merge="keep")
    for i in range(1000):
        s.append(i, 1.0 if i % 2 else 3.0)
    assert set(s.ys) <= {1.0, 3.0}, "every point drawn was measured, none averaged"
    noisy = History("async", run="async")
    for i in range(300):
        noisy.add_global(GlobalStep(i + 1, 1000.0 + i, 1.0 if i % 2 else 3.0))
    raw = Dashboard(None, runs=[noisy])
    raw.draw()
    (line,) = [ln for ln in raw.frame.ax["loss"].get_lines() if ln.get_label() == "async"]
    assert set(line.get_data()[1]) == {1.0, 3.0}
    assert "raw" in raw.frame.ax["loss"].get_title()
    smooth = Dashboard(None, runs=[noisy], smooth=20)
    smooth.draw()
    (line,) = [ln for ln in smooth.frame.ax["loss"].get_lines() if ln.get_label() == "async"]
    assert all(1.8 < y < 2.2 for y in line.get_data()[1][20:])
    assert "moving mean of 20 updates" in smooth.frame.ax["loss"].get_title()


def test_examples_axis_counts_every_batch_and_the_seconds_axis_starts_after_warm_up():
    from tfmagic.dashboard import Dashboard

    h = _sync_history(workers=3, updates=50, batch=32)
    h.add_eval(25, 1000.0 + 24 * 0.1 + 0.081, 0.5)
    tr = RunTrace(h, origin=990.0)
    tr.replay()
    snap = tr.copy()
    xs, _ = snap["examples"]
    assert xs[:3] == [96, 192, 288], "a sync update of 3 workers consumes 3 batches"
    assert snap["examples_total"] == h.examples_seen() == 50 * 96
    assert snap["evals"][0][:2] == (25, 25 * 96)
    assert snap["anchor"] == pytest.approx(h.warmup_ended_at - 990.0)
    dash = Dashboard(None, runs=[h], x="seconds")
    dash.draw()
    (line,) = [ln for ln in dash.frame.ax["loss"].get_lines() if ln.get_label() == "sync"]
    xs = line.get_data()[0]
    assert min(xs) == 0.0 and len(xs) == 50, "time 0 is the end of warm-up (the first update)"
    for x in ("updates", "examples"):
        dash.set_x(x)
        dash.draw()
        assert dash.frame.ax["loss"].get_xlabel() == {"updates": "updates", "examples": "examples seen"}[x]
    with pytest.raises(ValueError, match="updates, examples, seconds"):
        dash.set_x("epochs")


def test_warm_up_is_shown_apart_and_never_counted_in_throughput():
    from tfmagic.dashboard import Dashboard

    h = _sync_history(workers=2, updates=5)
    dash = Dashboard(None, runs=[])
    dash.watch(h)
    # records arriving live: the warm-up one is not counted
    for warm in (True, False, False):
        h.add_step(StepRecord("worker:0", 9, 2000.0, 2000.1, 1.0, mode="sync", warmup=warm))
    assert dash.rates.rate("worker:0", 2000.5) == pytest.approx(2 / dash.window)
    dash.draw()
    assert dash.frame.lim["tp_x0"] < 0, "the warm-up is a shaded span before time 0"
    assert "warm-up" in dash.header_html()


def test_the_gantt_strip_shows_the_straggler_busy_and_the_others_waiting():
    from tfmagic.dashboard import Dashboard

    h = _sync_history(workers=3, updates=40, slow="worker:2")
    dash = Dashboard(None, runs=[h], gantt_steps=10)
    name, t0, t1, rows = dash.gantt()
    shares = dash.traces[0].gantt.shares(t0, t1, rows)
    assert name == "sync" and sorted(rows) == ["worker:0", "worker:1", "worker:2"]
    assert t1 - t0 == pytest.approx(10 * 0.1 - 0.02, abs=0.03), "the last 10 steps"
    assert shares["worker:2"]["busy"] > 0.7 and shares["worker:2"]["wait"] < 0.01
    for fast in ("worker:0", "worker:1"):
        assert shares[fast]["busy"] < 0.3 and shares[fast]["wait"] > 0.5
    dash.draw()
    bars = {k[1]: a for k, a in dash.frame.lines.items() if k[0] == "gantt"}
    assert len(bars["busy"].get_paths()) == 30 and len(bars["wait"].get_paths()) >= 20


def test_staleness_histogram_counts_async_and_ssp_steps_after_warm_up_only():
    from tfmagic.dashboard import Dashboard

    h = History("async", run="async", workers=["worker:0", "worker:1", "worker:2"])
    for i in range(300):
        h.add_step(
            StepRecord(
                f"worker:{i % 3}", i, i, i + 1, 1.0, staleness=2 if i % 4 else 1, warmup=i < 3, update=i + 1
            )
        )
        h.add_global(GlobalStep(i + 1, float(i + 1), 1.0))
    tr = RunTrace(h, origin=0.0)
    tr.replay()
    assert tr.stale.n == 297
    assert tr.copy()["staleness"] == pytest.approx({1: 74 / 297, 2: 223 / 297})
    assert RunTrace(_sync_history(), origin=0.0).copy()["staleness"] is None, "sync has no staleness"
    dash = Dashboard(None, runs=[h])
    dash.draw()
    (mean,) = [a for k, a in dash.frame.lines.items() if k[0] == "stale-mean"]
    assert list(mean.get_data()[0]) == pytest.approx([520 / 297] * 2), "the dotted line at the mean"
    assert "mean staleness 1.75 (workers - 1 = 2)" in dash.header_html()


def test_comparison_table_says_examples_consumed_and_warm_up():
    from tfmagic.metrics import comparison_table

    sync = _sync_history(workers=3, updates=50, batch=32)
    table = comparison_table([sync])
    head, row = table.splitlines()
    assert "examples" in head and "warm-up s" in head
    assert row.split()[:4] == ["sync", "50", "4800", f"{sync.warmup_s:.1f}"]


def test_the_widget_selector_replots_the_loss_against_another_axis():
    from tfmagic.dashboard import Dashboard

    h = _sync_history(workers=3, updates=30)
    dash = Dashboard(None, runs=[h])
    dash.widget  # noqa: B018 - builds the widgets, as show() does
    frames = dash.frames
    dash._selector.value = "examples"
    assert dash.x == "examples" and dash.frames == frames + 1, "a finished dashboard redraws at once"
    (line,) = [ln for ln in dash.frame.ax["loss"].get_lines() if ln.get_label() == "sync"]
    assert max(line.get_data()[0]) == 30 * 96
    assert dash._image.value == dash.last_png


def test_frames_keep_to_their_share_of_the_kernel_and_say_so():
    """A frame holds Python's lock the engine's threads need: frames are spaced so their CPU
    time stays within ``budget`` of the kernel's, the header says why frames come less often,
    and while a frame draws the GIL switch interval is short (the engine gets the lock back fast)."""
    import sys

    from tfmagic.dashboard import Dashboard

    h = History("async", run="async", workers=["worker:0"])  # not done: the dashboard refreshes
    dash = Dashboard(None, runs=[h], refresh=0.05, budget=0.2)
    intervals = []

    def costly_update():  # 40 ms of this thread's CPU, like a frame with a full redraw
        intervals.append(sys.getswitchinterval())
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.04:
            pass

    dash.update = costly_update
    before = sys.getswitchinterval()
    dash.start()
    time.sleep(1.6)
    dash.stop()
    # unpaced, 1.6 s holds about 35 such frames; at 40 ms / 0.2 = 0.2 s apart, about 8
    assert 3 <= len(intervals) <= 14, len(intervals)
    assert dash.interval >= 0.15 and dash.frame_cpu_s >= 0.035
    assert max(intervals) <= 0.0005 and sys.getswitchinterval() == before
    note = dash.pace_note()
    assert "a frame every 0.2 s, not 0.05 s" in note and "20%" in note, note
    assert note in dash.header_html()


def test_a_frame_that_redraws_some_axes_looks_like_a_full_redraw():
    """When limits change, only the axes concerned are redrawn over the kept background (a full
    redraw is mostly tick and title text); the picture must be the one a full redraw makes:
    no half-erased labels, nothing drawn twice over itself."""
    import numpy as np

    from tfmagic.dashboard import Dashboard

    h = History("async", run="async", workers=["worker:0", "worker:1"])
    dash = Dashboard(None, runs=[h], refresh=0.5)
    t0 = time.time() - 10_000  # long past: the throughput window is empty, so frames are reproducible
    compared = 0
    for frame in range(12):
        for i in range(frame * 400, (frame + 1) * 400):
            loss = 2.0 / (1 + i / 50) ** 2  # falls through four decades: the y limits change
            h.add_step(
                StepRecord(f"worker:{i % 2}", i, t0 + i * 0.005, t0 + i * 0.005 + 0.004, loss, mode="async")
            )
            h.add_global(GlobalStep(i + 1, t0 + i * 0.005, loss))
        before = (dash.full_draws, dash.axes_draws)
        dash.draw()
        if dash.full_draws == before[0] == 1 and dash.axes_draws > before[1]:  # some axes were redrawn
            partial = np.asarray(dash.frame.canvas.buffer_rgba()).astype(int)
            dash.frame.background = None  # the same state, drawn whole
            dash.draw()
            whole = np.asarray(dash.frame.canvas.buffer_rgba()).astype(int)
            off = np.abs(partial - whole).max(axis=2) > 16
            assert off.mean() < 0.0005, f"frame {frame}: {off.sum()} pixels differ from a full redraw"
            compared += 1
            dash.frame.full_draws = 1
    assert compared >= 2, "the run must have changed some limits after the first frame"


def test_a_finished_runs_frame_fits_its_axes_and_close_events_share_a_label():
    """After the run: the axes end where the data end (not at the next doubling), every text of
    the frame reads (tfmagic.figcheck), and a kill and a restart 0.1 s apart get one label."""
    from tfmagic import figcheck
    from tfmagic.dashboard import Dashboard

    h = _sync_history(workers=3, updates=120, t0=time.time() - 20)
    h.ended_at = h.global_steps[-1].time
    dash = Dashboard(None, runs=[h])
    t = h.global_steps[60].time
    for dt, kind in ((0.0, "kill"), (0.1, "restart")):
        dash.marks.append(place_event(Event(t + dt, kind, "worker:1", "", step=60), dash.origin, None))
    assert figcheck.problems(dash.figure) == []
    loss = dash.frame.ax["loss"]
    assert 120 <= loss.get_xlim()[1] <= 125, loss.get_xlim()
    labels = [a.get_text() for a in dash.frame.ax["tp"].texts]
    assert "worker:1 kill; worker:1 restart" in labels, labels


@pytest.mark.unit
def test_a_dashboard_of_32_workers_summarises_them_and_reads_without_help():
    """32 workers as 32 lines in ten colours read as none: past 8 the throughput plot shows the fastest,
    median and slowest worker and names the slowest; the Gantt strip keeps every row and names at most 8.
    Synthetic steps (no cluster), drawn by the real dashboard, read by figcheck as any picture is."""
    import time

    from tfmagic import figcheck
    from tfmagic.dashboard import Dashboard

    h = History("async")
    dash = Dashboard(
        runs=[h], refresh=0.2, window=10.0
    )  # long: drawing late on a busy machine keeps the ratio
    now = time.time()
    step = 0
    for w in range(32):  # worker:17 is four times slower
        every = 0.4 if w == 17 else 0.1
        t = now - 20.0
        while t < now:
            h.add_step(StepRecord(f"worker:{w}", step, t, t + every * 0.9, 1.0, mode="async", examples=32))
            step += 1
            t += every
    for _ in range(3):
        dash.draw()
    tp = {key for key in dash.frame.lines if key[0].startswith("tp")}
    assert tp == {("tp", "fastest"), ("tp", "median"), ("tp", "slowest"), ("tp+", "band"), ("tp+", "who")}, tp
    who = dash.frame.lines[("tp+", "who")].get_text()
    assert who.startswith("32 workers; slowest now: worker:17"), who
    slow, median = (
        dash.frame.lines[("tp", "slowest")].get_ydata(),
        dash.frame.lines[("tp", "median")].get_ydata(),
    )
    assert 3.0 < median[-1] / slow[-1] < 5.0, (median[-1], slow[-1])  # the x4 worker, at its rate
    names = [t.get_text() for t in dash.frame.ax["gantt"].get_yticklabels()]
    # counted as a reader counts (not sorted as text), every row drawn, at most 8 named
    assert 2 <= len(names) <= 8 and names[0] == "0" and names[-1] == "31", names
    assert dash.frame.ax["gantt"].get_ylabel() == "worker"
    figcheck.require(dash.figure, "the dashboard of 32 workers")
