"""The live dashboard on real paced clusters: the pictures say what the algorithms do.

A paced cluster (tfmagic/pace.py) gives every worker a modelled machine, so a
worker slowed x4 really takes four times as long per step, whatever the two
cores of this machine do.  The Gantt strip must then show sync's straggler
busy and the others waiting for it, and async's staleness histogram must
centre on workers - 1 (each worker's gradient meets one update by each other
worker while it computes).
"""

from __future__ import annotations

import pytest

import tfmagic
from tfmagic import figcheck, plots
from tfmagic.dashboard import Dashboard
from tfmagic.dashdata import GanttTrace
from tfmagic.training import TrainingRun

from .conftest import SHARED, assert_gone, ran_again, share

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("no_leaks")]


@pytest.fixture(scope="module")
def paced():
    """1 ps + 3 workers, each worker a modelled machine of 40 ms per step."""
    cluster = tfmagic.LocalCluster(ps=1, workers=3, name="paced", spares=False, pace="40ms")
    cluster.start()
    handle = share(cluster)
    yield cluster
    SHARED.remove(handle)
    pids = [p.pid for p in cluster.procs.values()]
    cluster.close()
    assert_gone(pids)


def _watched(cluster, mode: str, steps: int, **kw) -> tuple[Dashboard, object]:
    run = TrainingRun(cluster, mode, model="digits", steps=steps, **kw)
    dash = Dashboard(cluster, runs=[run], refresh=0.2)
    dash.widget  # noqa: B018 - builds the widgets, as show() does
    run.start()
    dash.start()
    history = run.wait()
    dash.wait(30)
    assert not dash.refreshing and dash.frames >= 2 and dash.last_png.startswith(b"\x89PNG")
    # every picture of this run reads without help: no text cut or over other text, axes labelled
    figcheck.require(dash.figure, f"the dashboard of a {mode} run")
    figcheck.require(plots.convergence_figure([history]), f"the convergence figure of a {mode} run")
    figcheck.require(plots.gantt_figure(history), f"the Gantt figure of a {mode} run")
    if mode != "sync":
        figcheck.require(plots.staleness_figure(history), f"the staleness figure of a {mode} run")
    figcheck.require(cluster.placement().figure(), "the placement figure")
    return dash, history


def _as_modelled(shares) -> bool:
    slow, fast = shares["worker:2"], [shares[w] for w in ("worker:0", "worker:1")]
    return (
        slow["busy"] > 0.8 and slow["wait"] < 0.05 and all(f["busy"] < 0.4 and f["wait"] > 0.5 for f in fast)
    )


def test_gantt_strip_shows_the_slowed_worker_busy_and_the_others_waiting_in_sync(paced):
    for attempt in (1, 2):
        paced.slow("worker:2", 4)
        try:
            dash, history = _watched(paced, "sync", steps=40)
        finally:
            paced.slow("worker:2", 1)
        name, t0, t1, rows = dash.gantt()
        shares = GanttTrace.shares(t0, t1, rows)
        # shares measured against the clock: a loaded machine blurs them (the slow worker 0.796 busy
        # in a clean-clone run), and the test does what the dashboard would tell a user, once
        if attempt == 1 and not _as_modelled(shares):
            ran_again("the sync Gantt strip's shares", repr(shares))
            dash.stop()
            continue
        break
    assert name == "sync" and sorted(rows) == ["worker:0", "worker:1", "worker:2"], rows.keys()
    assert t1 - t0 == pytest.approx(10 * 0.16, rel=0.35), "the last 10 updates, each paced by the x4 worker"
    slow = shares["worker:2"]
    assert slow["busy"] > 0.8 and slow["wait"] < 0.05, shares
    for fast in ("worker:0", "worker:1"):
        assert shares[fast]["busy"] < 0.4 and shares[fast]["wait"] > 0.5, shares
    # the drawn bars are the same segments: 10 busy bars per worker at least, waits for the two fast ones
    bars = {key[1]: artist for key, artist in dash.frame.lines.items() if key[0] == "gantt"}
    assert len(bars["busy"].get_paths()) >= 30 and len(bars["wait"].get_paths()) >= 18
    assert "sync" in dash.frame.ax["gantt"].get_title()
    assert history.updates_per_s() < 1 / 0.16 * 1.25, "sync is paced by the slowest worker"


def test_async_staleness_histogram_centres_on_workers_minus_one(paced):
    dash, history = _watched(paced, "async", steps=300)
    snap = dash.traces[0].copy()
    assert snap["staleness"], "async steps fill the histogram"
    # near N - 1 = 2; lower when two workers' steps end together (each then sees the other's update
    # about half the time, lesson 02) or when this process's redraws hold up the workers' threads
    # (a two-lane run: mean 1.55, 13 % fresh, the mode still 2)
    assert 1.3 <= snap["mean_staleness"] <= 2.4, snap["staleness"]
    assert sum(snap["staleness"].values()) == pytest.approx(1.0)
    assert max(snap["staleness"], key=snap["staleness"].get) == 2, "the most common staleness is N - 1"
    assert f"mean staleness {snap['mean_staleness']:.2f} (workers - 1 = 2)" in dash.header_html()
    (mean,) = [a for key, a in dash.frame.lines.items() if key[0] == "stale-mean"]
    assert mean.get_data()[0][0] == pytest.approx(snap["mean_staleness"])
    name, t0, t1, rows = dash.gantt()
    shares = GanttTrace.shares(t0, t1, rows)
    assert all(row["wait"] == 0 for row in shares.values()), "nobody waits in async"
    # every x axis draws; the held-out probes move along it
    for x in ("updates", "examples", "seconds"):
        dash.set_x(x)
        dash.draw()
        (probe,) = [ln for ln in dash.frame.ax["eval"].get_lines() if ln.get_label() == "async"]
        xs, ys = probe.get_data()
        assert len(xs) >= 10 and ys[-1] < ys[0], (x, xs, ys)
        if x == "examples":
            assert max(xs) <= history.examples_seen() and max(xs) > 0.8 * 300 * 32


def test_per_worker_batch_sizes_on_the_thread_per_worker_path(paced):
    """Sync on a paced cluster runs a thread per worker and averages on the ps (steps.make_apply): with
    each worker its own batch, the average is weighted by examples, as the single-process reference."""
    import numpy as np

    from tfmagic.training.models import Linear

    from .test_training import reference_sync

    sizes = {"worker:0": 24, "worker:1": 8, "worker:2": 8}
    run = TrainingRun(paced, "sync", model=Linear(), steps=20, batch_size=sizes, lr=0.1).start()
    run.wait()
    assert run.history.config["engine"] == "sync"
    expected = reference_sync(Linear(), 3, 20, [24, 8, 8], "sgd", 0.1)
    for got, want in zip(run.final_weights, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert {r.task: r.examples for r in run.history.records} == sizes
