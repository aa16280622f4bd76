"""Sync and async training on real clusters: correctness, accounting, failures."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

import tfmagic
from tfmagic.spec import TaskName
from tfmagic.training import KerasModel, TrainingError, TrainingRun
from tfmagic.training.models import Digits, Linear
from tfmagic.training.optimizers import Optimizer

from .conftest import SHARED, assert_gone, kept_pace, poll_for, share

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("no_leaks")]


def reference_sync(
    model, workers: int, steps: int, batch, optimizer: str, lr: float, seed: int = 0, weighted: bool = True
):
    """Single-process sync SGD on the same shards and batches: the ground truth.

    ``batch`` is one size, or a list with each worker's; with sizes that differ the gradients are
    averaged weighted by examples (``weighted=False``: a plain mean, to show the difference)."""
    import tensorflow as tf

    sizes = list(batch) if isinstance(batch, (list, tuple)) else [batch] * workers

    with tf.device("/job:localhost/replica:0/task:0/device:CPU:0"):
        weights = [tf.Variable(w) for w in model.initial_weights(seed)]
        opt = Optimizer(optimizer, lr)
        opt.create_slots(weights)
        shards = [model.data.shard(i, workers) for i in range(workers)]
        for t in range(steps):
            grads = []
            for (x, y), size in zip(shards, sizes, strict=True):
                idx = (t * size + np.arange(size)) % len(x)
                with tf.GradientTape() as tape:
                    loss = model.loss(weights, tf.constant(x[idx]), tf.constant(y[idx]))
                grads.append(tape.gradient(loss, weights))
            if len(set(sizes)) > 1 and weighted:
                avg = [
                    tf.add_n([g[j] * float(n) for g, n in zip(grads, sizes, strict=True)]) / float(sum(sizes))
                    for j in range(len(weights))
                ]
            else:
                avg = [tf.add_n([g[j] for g in grads]) / float(workers) for j in range(len(weights))]
            opt.apply(avg, weights)
        return [w.numpy() for w in weights]


def run_to_end(cluster, mode, **kw) -> TrainingRun:
    run = TrainingRun(cluster, mode, **kw).start()
    run.wait()
    return run


@pytest.mark.parametrize(
    "model, optimizer, lr",
    [(Linear(), "sgd", 0.1), (Digits(), "momentum", 0.05), (Digits(), "adagrad", 0.1)],
    ids=["linear-sgd", "digits-momentum", "digits-adagrad"],
)
def test_sync_equals_single_process_reference(local_cluster, model, optimizer, lr):
    run = run_to_end(local_cluster, "sync", model=model, steps=40, batch_size=16, optimizer=optimizer, lr=lr)
    expected = reference_sync(model, 2, 40, 16, optimizer, lr)
    for got, want in zip(run.final_weights, expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    h = run.history
    assert h.steps == 40 and len(h.records) == 80
    assert all(r.applied and not r.dropped for r in h.records)
    assert [g.step for g in h.global_steps] == list(range(1, 41))
    assert all(sorted(g.aggregated) == ["worker:0", "worker:1"] for g in h.global_steps)


def test_per_worker_batch_sizes_weight_syncs_average_by_examples(local_cluster):
    # Seed 002: each worker its own batch. Sync's average is then the mean over all the examples of
    # the step (worker:0's 24 count three times worker:1's 8). The thread-per-worker path (paced
    # clusters, backup workers) is checked the same way in tests/test_dashboard.py, on a paced cluster.
    sizes = {"worker:0": 24, "worker:1": 8}
    run = run_to_end(local_cluster, "sync", model=Linear(), steps=20, batch_size=sizes, lr=0.1)
    assert run.history.config["engine"] == "fused" and run.history.config["batch_size"] == sizes
    expected = reference_sync(Linear(), 2, 20, [24, 8], "sgd", 0.1)
    plain = reference_sync(Linear(), 2, 20, [24, 8], "sgd", 0.1, weighted=False)
    assert not np.allclose(expected[0], plain[0], rtol=1e-3), "the weighting must matter for this test"
    for got, want in zip(run.final_weights, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    examples = {r.task: r.examples for r in run.history.records}
    assert examples == {"worker:0": 24, "worker:1": 8}
    assert run.history.examples_seen() == 20 * 32


@pytest.mark.parametrize(
    "sizes, match",
    [
        (
            {"worker:2": 16},
            r"names 'worker:2', which is not a worker of this cluster \(its workers are worker:0 to worker:1\)",
        ),
        ({"ps:0": 16}, "names 'ps:0', which is not a worker"),
        ({"worker:0": 0}, r"batch_size\['worker:0'\] must be a whole number >= 1, not 0"),
        ({}, "names no worker"),
    ],
)
def test_bad_per_worker_batch_sizes_say_what_to_give(local_cluster, sizes, match):
    with pytest.raises(TrainingError, match=match):
        TrainingRun(local_cluster, "sync", model=Linear(), steps=5, batch_size=sizes)


def test_variables_are_spread_over_the_ps_tasks_and_data_stays_on_workers():
    with tfmagic.LocalCluster(ps=2, workers=1, spares=False) as cluster:
        run = run_to_end(cluster, "async", model=Digits(), steps=20)
        devices = [v.device for v in run.variables]
        assert {d.split("/device")[0] for d in devices} == {
            "/job:ps/replica:0/task:0",
            "/job:ps/replica:0/task:1",
        }
        w = run.policy.workers[tfmagic.TaskName("worker", 0)]
        assert all(t.device.startswith("/job:worker/replica:0/task:0") for t in w.tensors)


def test_async_converges_and_records_every_update(local_cluster):
    h = tfmagic.train(local_cluster, mode="async", model="digits", steps=400, lr=0.1, batch_size=32)
    assert h.mode == "async" and h.final_accuracy > 0.9 and h.final_loss < 0.5
    applied = sorted(g.step for g in h.global_steps)
    missing = sorted(set(range(1, 401)) - set(applied))
    assert not missing and len(applied) == len(set(applied)), (
        missing,
        [(e.kind, e.detail) for e in h.events],
    )
    assert all(r.staleness >= 0 for r in h.records)
    tp = h.throughput()
    assert set(tp) == {"worker:0", "worker:1", "total"}
    assert tp["total"]["examples_per_s"] == pytest.approx(32 * tp["total"]["steps_per_s"])
    # each worker's log tells its own part of the run, as the seeds' worker0.out did
    for task in ("worker:0", "worker:1"):
        mine = sum(1 for r in h.records if r.task == task and r.applied)

        def log_with_the_end(task=task):
            text = local_cluster.logs(task, tail=None)
            return text if f"run {h.run} (async): ended at update" in text else None

        text = poll_for(log_with_the_end, 10, what=f"{task}'s progress in its log")
        assert f"run {h.run} (async): update " in text
        assert (
            f"run {h.run} (async): ended at update 400, final held-out loss {h.final_loss:.4f}; {mine} of its"
            in text
        )


@pytest.fixture(scope="module")
def paced3():
    """1 ps + 3 workers paced at 40 ms (no spares), shared by this module's paced tests."""
    with tfmagic.LocalCluster(ps=1, workers=3, pace="40ms", name="paced3", spares=False) as cluster:
        yield cluster


def test_ssp_never_lets_an_update_be_staler_than_its_rule_allows(paced3):
    """SSP with bound s on N paced, jittery workers: no applied update staler than (2s + 1)(N - 1)
    (derived in tfmagic.experiments.ssp). A worker's clock counted steps computed, not landed, and a
    paced step's gradient lands with the next call: updates reached 5 with bound 0 and 4 workers."""
    from tfmagic.experiments.ssp import bound

    paced3.pace.jitter = 0.5
    try:
        for s in (0, 1):
            h = tfmagic.train(paced3, "ssp", model="linear", steps=120, staleness=s, seed=s)
            stale = [r.staleness for r in h.records if r.applied and not r.warmup]
            assert len(stale) >= 100, len(stale)
            assert max(stale) <= bound(s, 3), (s, max(stale), sorted(stale)[-10:])
            assert sum(stale) > 0, "bounded, but not lock-step sync"
    finally:
        paced3.pace.jitter = 0.0


def test_paced_async_makes_updates_at_the_modelled_rate(paced3):
    """Three workers of 200 ms steps make an update every 66.7 ms: a worker thread's bookkeeping between
    two calls (reading the ring of step numbers) counts inside its next modelled step, as on a real
    machine, instead of lengthening every step (async ran 4-6 % slower than its model before).

    200 ms, not 100: this machine, quiet, left 11-28 % of 80 ms steps late in 3-worker async runs
    (2026-12-03; a 10-million-step Python loop took 1.7-2.1 s), and the CI missed 100 ms twice."""
    paced3.pace.base = 0.2
    try:
        h = kept_pace("paced async's rate", lambda: tfmagic.train(paced3, "async", model="linear", steps=150))
    finally:
        paced3.pace.base = 0.04
    assert not [n for n in h.notes if "could not keep" in n], h.notes
    interval = 1 / h.updates_per_s()
    assert abs(interval / (0.2 / 3) - 1) < 0.03, f"{interval * 1000:.1f} ms per update, modelled 66.7"


def test_k_sync_stops_the_late_steps_where_backup_workers_finish_and_drop_them(paced3):
    """late="cancel" (K-sync SGD, Dutta et al.): a worker still in its step when the update is made stops
    there and starts the next from the new parameters, so a x8 straggler never delivers a gradient; with
    "finish" (SyncReplicasOptimizer) it finishes each step and its gradient is dropped as stale."""
    paced3.slow("worker:2", 8)
    try:
        cancel = tfmagic.train(paced3, "sync", model="linear", steps=30, backup_workers=1, late="cancel")
        finish = tfmagic.train(paced3, "sync", model="linear", steps=30, backup_workers=1)
    finally:
        paced3.slow("worker:2", 1)
    assert not cancel.dropped(), cancel.dropped()
    assert all("worker:2" not in g.aggregated for g in cancel.global_steps[1:])
    stopped = [n for n in cancel.notes if n.startswith("late='cancel'")]
    assert stopped and "worker:2" in stopped[0], cancel.notes
    assert finish.dropped().get("worker:2", 0) >= 2, finish.dropped()
    assert not [n for n in finish.notes if n.startswith("late='cancel'")]


def test_pace_auto_measures_the_machine_and_its_runs_keep_the_pace(monkeypatch):
    """pace="auto": measured before the first paced run (an unpaced probe of every worker at once),
    then sync and async run at that pace, and say so exactly when the machine did not keep it. A
    machine that could keep no pace up to the ceiling says so in one line, with what it measured."""
    from tfmagic.errors import BadPace
    from tfmagic.training import calibrate
    from tfmagic.training.calibrate import CEILING, FLOOR

    with tfmagic.LocalCluster(ps=1, workers=3, pace="auto", name="auto-pace") as cluster:
        assert not cluster.pace.calibrated
        with monkeypatch.context() as m:
            m.setattr(calibrate, "CEILING", 0.001)  # this machine, judged against a 1 ms ceiling
            with pytest.raises(BadPace) as info:
                tfmagic.train(cluster, "sync", model="digits", steps=10)
        assert "too busy to keep any pace for 3 workers" in str(info.value) and "updates/s" in str(info.value)
        assert "\n" not in str(info.value) and not cluster.pace.calibrated
        sync = tfmagic.train(cluster, "sync", model="digits", steps=40)
        assert cluster.pace.calibrated and FLOOR <= cluster.pace.base <= CEILING
        assert "updates/s here" in cluster.pace.measured and "(auto)" in cluster.pace.describe()
        measured = cluster.pace.base
        asyn = tfmagic.train(cluster, "async", model="digits", steps=120)
        assert cluster.pace.base == measured, "measured once"
        for h in (sync, asyn):
            # Whether the machine keeps the pace depends on what the other test lane runs meanwhile (a
            # clean-clone run: 13 % of the steps late at 60 ms beside it; the lessons, in this lane,
            # check it held in their own runs). What must hold here: the run says so exactly when it
            # did not keep it, with the share of late steps its records show.
            recs = [r for r in h.records if r.paced is not None and not r.warmup and r.compute is not None]
            late = sum(1 for r in recs if r.duration > r.paced * 1.25) / len(recs)
            over = sum(max(0, r.duration - r.paced) for r in recs) / sum(r.paced for r in recs)
            said = [n for n in h.notes if "could not keep" in n]
            assert bool(said) == (late > 0.1 and over > 0.05), (late, over, h.notes)
            assert not said or f"{late:.0%} of the steps took longer than modelled" in said[0], said
            steps = [r.duration for r in h.records if r.paced is not None and not r.warmup]
            # Free steps take at most a third of the pace: "auto" picks a pace whose workers ask for at
            # most a third of what the probe made.  Paced steps' on-device times fall a little under the
            # pace, by the engine's bookkeeping between calls, which counts inside the modelled step:
            # medians of 35.9 and 31.9 ms of a 40 ms pace in two clean-clone runs.
            assert len(steps) > 20 and sorted(steps)[len(steps) // 2] >= 0.6 * measured, "paced, not free"


def test_async_staleness_grows_for_a_slowed_worker(paced3):
    """Controlled case: while worker 2's modelled machine is 4x slower, the two others apply about
    eight updates during each of its steps, and it hardly any during theirs.

    On a paced cluster, where the slowdown is the model's: on the unpaced session cluster, slowing a
    process (1/16) also slowed the other worker, whose calls share this process's client (a two-lane
    run measured worker 1 at 0.2 and worker 0 at 0.33), and at an exact 1/16 worker 1's first call
    outlasted the whole run (a CI run, 2026-11-28)."""
    # 200 ms, not the fixture's 40: the ratios are the model's at any pace, and a quiet run of this
    # machine left 13-28 % of 80 ms steps late (the last CI missed 80 ms twice in a row)
    paced3.pace.base = 0.2
    paced3.slow("worker:2", 4)
    try:
        h = kept_pace(
            "async staleness of a slowed worker",
            lambda: tfmagic.train(paced3, mode="async", model="linear", steps=180, lr=0.05),
        )
    finally:
        paced3.slow("worker:2", 1)
        paced3.pace.base = 0.04
    assert not [n for n in h.notes if "could not keep" in n], h.notes
    stale = h.staleness()
    # the model: 2 x 4 = 8 for worker 2; 1 + 1/4 for each of the others
    assert stale["worker:2"] > 5 and max(stale["worker:0"], stale["worker:1"]) < 2, stale
    updates = sorted(r.update for r in h.records)
    assert updates == list(range(1, len(updates) + 1)), "each update has its own step number"
    for r in h.records:  # staleness: exactly the updates others applied between this read and apply
        between = [u for u in updates if r.step < u < r.update]
        assert r.staleness == len(between) == r.update - 1 - r.step
    assert any(e.kind == "slow" for e in paced3.events)


@pytest.fixture(scope="module")
def cluster3(request):
    """1 ps + 3 workers, with warm spares so restarts take a fraction of a second."""
    import os

    from tfmagic.pool import SparePool

    old = os.environ.get("TFMAGIC_SPARES")
    os.environ["TFMAGIC_SPARES"] = "1"
    pool = SparePool(budget="4GB")
    cluster = tfmagic.LocalCluster(ps=1, workers=3, name="three", pool=pool)
    cluster.start()
    poll_for(lambda: len([p for p in pool.processes() if p.warm_at]) >= 2, 180, what="warm spares")
    handle = share(cluster, pool)
    yield cluster
    SHARED.remove(handle)
    pids = handle()
    cluster.close()
    pool.shutdown()
    assert_gone(pids)
    if old is None:
        os.environ.pop("TFMAGIC_SPARES", None)
    else:
        os.environ["TFMAGIC_SPARES"] = old


def _heal(cluster):
    for task, proc in list(cluster.procs.items()):
        if not proc.alive:
            cluster.restart(task)


@pytest.fixture
def c3(cluster3):
    _heal(cluster3)
    yield cluster3
    for task in list(cluster3.slowness):
        cluster3.slow(task, 1)
    _heal(cluster3)


def test_sync_with_a_backup_worker_drops_the_stragglers_gradients(c3):
    # 4: the throttle keeps the share it is asked for since 2026-11-27 (asked for 1/8 it gave about 1/4
    # before); at 1/8 worker:2 finished no step within the run's 200 updates, so none was there to drop
    c3.slow("worker:2", 4)
    run = run_to_end(c3, "sync", model="digits", steps=200, backup_workers=1)
    h = run.history
    assert h.steps == 200
    assert all(len(g.aggregated) == 2 for g in h.global_steps), "replicas_to_aggregate = 3 - 1"
    applied = [r for r in h.records if r.applied]
    assert len(applied) == 200 * 2
    dropped = h.dropped()
    slow_applied = sum(1 for r in applied if r.task == "worker:2")
    assert dropped.get("worker:2", 0) >= 3 and slow_applied <= 20, (dropped, slow_applied)
    for r in applied:
        assert not r.dropped
    assert all(r.dropped and not r.applied for r in h.records if not r.applied)
    assert any(e.kind == "dropped" and e.task == "worker:2" for e in h.events)


def test_a_worker_killed_under_async_costs_the_run_only_its_own_steps(c3):
    """Issue 22 item 11: in 3 of 6 such runs the end waited 60 s on the dead worker's gRPC stream.

    The run finishes in seconds (a hang is a minute: the bound only separates the two), every
    update is recorded or counted as lost with the dead worker's records, and the cluster takes the
    worker back.
    """
    for attempt in range(3):
        run = tfmagic.train(c3, "async", steps=600, block=False, name=f"kill-{attempt}")
        poll_for(lambda run=run: run.history.steps > 50, 60, what="async to be stepping")
        c3.kill("worker:1")
        killed = time.monotonic()
        run.wait(45)
        assert time.monotonic() - killed < 30, f"attempt {attempt}: the run waited on the dead worker"
        assert run.error is None, run.error
        h = run.history
        assert h.steps + h.unrecorded == 600, (h.steps, h.unrecorded)  # the dead worker's own records
        told = [e.kind for e in h.events if e.task == "worker:1" and e.kind in ("kill", "lost")]
        assert told[:1] == ["kill"], f"the history tells the kill after its effect: {told}"
        c3.restart("worker:1")


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_worker_dying_as_the_run_places_it_costs_the_run_only_its_own_steps(c3, monkeypatch, mode):
    """A worker that died just before the run placed it (killed from outside, 0.3 s before): the run's
    setup waited for ever on the dead worker's stream (a variable's shape), and where gRPC had already
    failed the call, the whole run failed ("worker:1 is gone; restart it and resume()", 0 of 600 updates:
    bench/worker_kill.py --kill-at random --within 0.3, 5 of 25 runs). Now the run goes on with the
    others, as when a worker dies a moment later; sync with a backup worker too."""
    place, killed = TrainingRun.place, []

    def dies_as_placed(self, w):
        if w.task == TaskName("worker", 1) and not killed:
            killed.append(self.cluster.procs[w.task].pid)
            os.kill(killed[0], signal.SIGKILL)  # from outside, as the OOM killer would
            time.sleep(0.3)  # gRPC sees the connection close: the placement's calls fail at once
        place(self, w)

    monkeypatch.setattr(TrainingRun, "place", dies_as_placed)
    extra = {"backup_workers": 1} if mode == "sync" else {}
    run = run_to_end(c3, mode, steps=200, **extra)
    h = run.history
    assert run.error is None and h.steps == 200, (run.error, h.steps)
    assert not [r for r in h.records if r.task == "worker:1"], "the dead worker made no step"
    assert {r.task for r in h.records} == {"worker:0", "worker:2"}
    assert [e.kind for e in h.events if e.task == "worker:1"][:1] == ["lost"], h.events


def test_sync_without_backups_is_paced_by_the_slowest_worker(c3):
    c3.slow("worker:2", 6)
    h = run_to_end(c3, "sync", model="digits", steps=40).history
    assert h.dropped() == {}
    assert all(len(g.aggregated) == 3 for g in h.global_steps)
    by = h.by_task()
    # every worker did every step: the fast ones waited for the slow one
    assert {t: len(r) for t, r in by.items()} == {"worker:0": 40, "worker:1": 40, "worker:2": 40}


def test_async_goes_on_without_a_lost_worker_and_it_rejoins_after_restart(c3):
    run = TrainingRun(c3, "async", model="digits", steps=2500, lr=0.05).start()
    poll_for(lambda: run.history.steps >= 100, 60, what="100 updates")
    c3.kill("worker:2")
    at_kill = run.history.steps
    poll_for(lambda: run.history.steps >= at_kill + 200, 60, what="progress without worker:2")
    during = [
        r for r in run.history.records if r.task == "worker:2" and r.start > run.history.events[-1].time
    ]
    assert not during
    c3.restart("worker:2")
    poll_for(
        lambda: any(e.kind == "rejoin" for e in run.history.events) or not run.running, 60, what="rejoin"
    )
    h = run.wait()
    kinds = [(e.kind, e.task) for e in h.events]
    assert (
        ("kill", "worker:2") in kinds and ("restart", "worker:2") in kinds and ("rejoin", "worker:2") in kinds
    )
    rejoin_at = next(e.time for e in h.events if e.kind == "rejoin")
    assert any(r.task == "worker:2" and r.start >= rejoin_at for r in h.records), "worker:2 stepped again"
    assert h.error is None and h.final_accuracy > 0.9
    # Every update the ps applied is accounted for: recorded, or counted as made by the killed worker
    # just before it died (its last rows were on it; a run used to end "2490/2500 updates").
    recorded = {g.step for g in h.global_steps}
    assert len(recorded) == h.steps, "no update recorded twice"
    assert h.steps + h.unrecorded == 2500, (h.steps, h.unrecorded)
    assert len(set(range(1, 2501)) - recorded) == h.unrecorded
    if h.unrecorded:
        assert any("worker:2" in n and "have no record" in n for n in h.notes), h.notes
        assert f"{h.steps} updates recorded, 2500 applied" in h.summary()


def test_sync_with_a_backup_goes_on_when_a_worker_dies(c3):
    run = TrainingRun(c3, "sync", model="digits", steps=150, backup_workers=1).start()
    poll_for(lambda: run.history.steps >= 30, 60, what="30 updates")
    c3.kill("worker:1")
    h = run.wait()
    assert h.steps == 150 and h.error is None
    assert ("kill", "worker:1") in [(e.kind, e.task) for e in h.events]


def test_sync_without_backups_fails_fast_with_a_clear_message(c3):
    run = TrainingRun(c3, "sync", model="digits", steps=5000).start()
    poll_for(lambda: run.history.steps >= 30, 60, what="30 updates")
    c3.kill("worker:1")
    t0 = time.monotonic()
    with pytest.raises(TrainingError, match=r"needs all 3 workers.*worker:1 was lost.*backup_workers=1"):
        run.wait(timeout=30)
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_losing_the_ps_is_reported_within_seconds_and_training_resumes(c3, mode):
    run = TrainingRun(c3, mode, model="digits", steps=500, checkpoint_every=40, lr=0.05).start()
    poll_for(
        lambda: run.history.steps >= 150 and run.checkpoints.last_step >= 40,
        60,
        what=lambda: f"150 updates and a checkpoint (errors: {run.checkpoints.errors})",
    )
    c3.kill("ps:0")
    t0, killed_at = time.monotonic(), time.time()
    with pytest.raises(TrainingError, match=r"ps:0 was lost.*restart.*resume\(\)"):
        run.wait(timeout=30)
    assert time.monotonic() - t0 < 5
    ckpt_step = run.checkpoints.last_step
    assert ckpt_step >= 40, f"no checkpoint; attempts failed with: {run.checkpoints.errors}"
    c3.restart("ps:0")
    run.resume()
    h = run.history
    assert h.error is None and h.final_accuracy > 0.85
    assert h.global_steps[-1].step >= 500
    assert any(e.kind == "resume" and str(ckpt_step) in e.detail for e in h.events)
    if mode == "sync":  # every step after the checkpoint was made again, once
        after = [g.step for g in h.global_steps if g.time > killed_at]
        assert after == list(range(ckpt_step + 1, 501)), (ckpt_step, after[:5], after[-5:])
    # each step counts once: the updates lost with the ps are marked as rolled back, not counted twice
    steps = [g.step for g in h.global_steps]
    assert len(steps) == len(set(steps)) and h.steps == len(steps) <= 500
    assert all(g.step > ckpt_step for g in h.rolled_back)
    assert repr(run).endswith(f"{h.steps}/500 updates>"), repr(run)
    if h.rolled_back:
        assert any(e.kind == "rollback" for e in h.events)
        assert any(r.rolled_back for r in h.records)


def test_a_user_keras_model_trains(local_cluster):
    import keras

    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 4)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], np.float32) + 1.0).reshape(-1, 1)

    def build():
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])

    model = KerasModel(build, x=x, y=y, loss="mse")
    h = tfmagic.train(local_cluster, mode="sync", model=model, steps=150, lr=0.1, batch_size=32)
    assert h.final_loss < 0.01, h.final_loss


def test_the_held_out_loss_runs_the_model_in_inference_mode(local_cluster):
    """Dropout is on in training steps and off for the held-out loss, as Keras' evaluate does;
    batch-norm statistics move on the workers and the held-out loss uses them."""
    import keras

    rng = np.random.default_rng(1)
    x = rng.normal(size=(512, 4)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], np.float32)).reshape(-1, 1)

    def build():
        return keras.Sequential(
            [
                keras.Input((4,)),
                keras.layers.BatchNormalization(),
                keras.layers.Dropout(0.5),
                keras.layers.Dense(1),
            ]
        )

    model = KerasModel(build, x=x, y=y, loss="mse")
    run = TrainingRun(local_cluster, "sync", model=model, steps=40, lr=0.05).start()
    run.wait(timeout=120)
    local = build()
    # batch-norm statistics moved on the workers (they start at mean 0, variance 1)
    mean, var = run.final_state[0], run.final_state[1]
    assert np.abs(mean).max() > 0.01 and np.abs(var - 1).max() > 0.01, run.final_state
    trainable = iter(run.final_weights)
    state = iter(run.final_state)
    local.set_weights([next(trainable) if v.trainable else next(state) for v in local.weights])
    xt, yt = model.data.x_test, model.data.y_test
    inference = float(np.mean((local(xt, training=False).numpy() - yt) ** 2))
    dropped = float(np.mean((local(xt, training=True).numpy() - yt) ** 2))
    assert run.history.final_loss == pytest.approx(inference, rel=1e-4), (run.history.final_loss, dropped)
    assert abs(dropped - inference) > 1e-3  # the check can tell the two apart


def _separable(n, seed):
    import tensorflow as tf

    x = tf.random.stateless_normal([n, 8], seed=(seed, 2))
    return x, tf.cast(tf.reduce_sum(x, axis=1) > 0, tf.int32)


def _small_classifier():
    import keras

    return keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)]
    )


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_keras_input_fn_runs_on_each_worker(local_cluster, tmp_path, mode):
    """input_fn(i, workers) runs in worker i's own process (read from /proc/self there), on a
    stream longer than anything copied before (20,000 examples); eval_fn gives the held-out loss."""
    import keras
    import tensorflow as tf

    def input_fn(shard, shards):
        # which process builds this shard: /proc/self is the process that reads it
        tf.io.write_file(str(tmp_path / f"shard-{shard}-of-{shards}"), tf.io.read_file("/proc/self/stat"))
        return (
            tf.data.Dataset.from_tensor_slices(_separable(20000, 1))
            .shard(shards, shard)
            .shuffle(512, seed=shard)
        )

    model = KerasModel(
        _small_classifier,
        input_fn=input_fn,
        eval_fn=lambda: tf.data.Dataset.from_tensor_slices(_separable(1000, 7)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        classifier=True,
    )
    assert len(model.data.x) == 0  # nothing to copy: the workers read their own input
    h = tfmagic.train(local_cluster, mode=mode, model=model, steps=300, lr=0.1)
    for i in range(2):
        pid = int((tmp_path / f"shard-{i}-of-2").read_text().split()[0])
        assert pid == local_cluster.procs[tfmagic.TaskName("worker", i)].pid, (i, pid)
    assert not (tmp_path / "shard-0-of-1").exists()  # with eval_fn the kernel never calls input_fn
    assert h.final_loss_label == "held-out loss"
    assert h.final_accuracy > 0.9, h.summary()


def test_without_eval_fn_the_loss_says_it_is_on_training_examples(local_cluster):
    import keras
    import tensorflow as tf

    def input_fn(shard, shards):
        return tf.data.Dataset.from_tensor_slices(_separable(600, 1)).shard(shards, shard)

    model = KerasModel(
        _small_classifier,
        input_fn=input_fn,
        eval_examples=100,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        classifier=True,
    )
    assert len(model.data.x_test) == 100
    h = tfmagic.train(local_cluster, mode="async", model=model, steps=200, lr=0.1)
    assert "loss on the first 100 training examples (no eval_fn)" in h.summary()
    assert h.final_accuracy > 0.85, h.summary()


def test_a_worker_whose_input_fn_shard_is_empty_stops_training_with_what_to_do(local_cluster):
    import keras
    import tensorflow as tf

    def input_fn(shard, shards):  # worker 0 gets 3 examples, worker 1 none
        x, y = _separable(3, 1)
        return tf.data.Dataset.from_tensor_slices((x, y)).skip(3 * shard)

    model = KerasModel(
        _small_classifier,
        input_fn=input_fn,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    run = TrainingRun(local_cluster, "async", model=model, steps=2000, batch_size=2).start()
    run.wait(timeout=120, raise_error=False)
    events = [(e.kind, e.task, e.detail[:120]) for e in run.history.events]
    assert run.error is not None, events
    assert "worker:1 has no training examples: input_fn(1, 2) returned an empty" in str(run.error), events


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"input_fn": lambda s, n: [1, 2]}, "must return a tf.data.Dataset"),
        ({"input_fn": "data.csv"}, "must be a function"),
        ({"input_fn": lambda s, n: _ds_of_x_only()}, r"\(x, y\) pairs"),
        ({"x": np.zeros((4, 8)), "y": np.zeros(4), "input_fn": lambda s, n: None}, "not both"),
        ({}, "needs x and y arrays or an input_fn"),
    ],
)
def test_keras_model_bad_data_says_what_to_pass(kwargs, match):
    with pytest.raises(ValueError, match=match):
        KerasModel(_small_classifier, **kwargs)


def _ds_of_x_only():
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(np.zeros((4, 8), np.float32))


def test_tensorboard_event_files_per_mode_and_task(local_cluster, tmp_path):
    """One event file per task that took a step, and one for the global series.

    Sync always has both workers; an async run of a few steps may be taken by one
    worker alone (the other still tracing its first step), and a worker without a
    step gets no directory rather than an empty one."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for mode in ("sync", "async"):
        history = tfmagic.train(local_cluster, mode=mode, model="linear", steps=20, logdir=tmp_path)
        records, _, _ = history.snapshot()
        stepped = sorted({str(r.task).replace(":", "-") for r in records})
        if mode == "sync":
            assert stepped == ["worker-0", "worker-1"]
        assert stepped, "no worker took a step"
        assert sorted(p.name for p in (tmp_path / mode).iterdir()) == sorted([*stepped, "global"])
        for who in (*stepped, "global"):
            d = tmp_path / mode / who
            files = list(d.glob("events.out.tfevents.*"))
            assert len(files) == 1, (d, files)
            acc = EventAccumulator(str(d))
            acc.Reload()
            assert "loss" in acc.Tags()["tensors"] or "loss" in acc.Tags()["scalars"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mode": "sideways"}, "mode must be"),
        ({"mode": "sync", "backup_workers": 2}, "at most 1"),
        ({"mode": "async", "backup_workers": 1}, "only makes sense"),
        ({"mode": "sync", "steps": 0}, "steps must be"),
        ({"mode": "sync", "optimizer": "adam"}, "unknown optimizer"),
        ({"mode": "sync", "model": "resnet"}, "unknown model"),
        ({"mode": "sync", "lr": -1}, "lr must be"),
        ({"mode": "sync", "backup_workers": 1, "late": "drop"}, "late must be 'finish' or 'cancel'"),
        ({"mode": "sync", "late": "cancel"}, "late='cancel' is for sync with backup_workers"),
        ({"mode": "sync", "backup_workers": 1, "late": "cancel"}, "late='cancel' needs a paced cluster"),
    ],
)
def test_bad_training_arguments_say_what_to_do(local_cluster, kwargs, match):
    mode = kwargs.pop("mode")
    with pytest.raises(TrainingError, match=match):
        TrainingRun(local_cluster, mode, **kwargs)


def test_compare_runs_both_from_the_same_start(local_cluster):
    comp = tfmagic.compare(local_cluster, model="digits", steps=100, lr=0.1)
    sync, async_ = comp.histories
    assert (sync.mode, async_.mode) == ("sync", "async")
    w_sync = comp.runs[0].initial_weights or comp.runs[0].model.initial_weights(0)
    assert comp.runs[0].model is comp.runs[1].model
    assert sync.final_loss is not None and async_.final_loss is not None
    table = comp.table()
    assert "sync" in table and "async" in table and "held-out loss" in table
    assert len(w_sync) == 4


def test_a_second_run_or_comparison_on_a_training_cluster_is_refused_in_one_line(local_cluster):
    """Two runs on the same tasks at once deadlock inside TensorFlow: the second start is refused, in
    the caller, naming the run that trains; once that one ends, a new run starts.

    On the session's cluster, which the tests before it use: going back to ``cluster3`` here meant a
    change of the connection (``update_server_def``), and that change hung past its 10 s deadline in
    CI runs after this module's kill-and-restart tests (issue 22 item 11, open), failing this test and,
    with the connection change still pending, the next two. Switching clusters is tested elsewhere.
    """
    c3 = local_cluster
    first = tfmagic.train(c3, mode="async", model="linear", steps=100_000, block=False, name="long")
    try:
        # bounded: a run that ended at once (seen twice, under load, after the tests before it
        # killed and healed tasks) made this loop wait for ever and CI with it
        poll_for(lambda: first.history.steps >= 5 or not first.running, 120, what="5 updates of 'long'")
        assert first.running, f"'long' ended before 5 updates: {first.error!r}; {first.history.events[-3:]}"
        for start in (
            lambda: tfmagic.train(c3, mode="sync", model="linear", steps=10, block=False),
            lambda: tfmagic.compare(c3, model="linear", steps=10, block=False),
        ):
            with pytest.raises(TrainingError) as err:
                start()
            msg = str(err.value)
            assert msg.startswith("the cluster is already training 'long' (") and "run.stop()" in msg, msg
            assert "\n" not in msg
        assert first.running, "the refusal left the first run alone"
    finally:
        first.stop()
    assert tfmagic.train(c3, mode="sync", model="linear", steps=5).steps == 5


def test_an_event_after_the_runs_last_update_is_refused_in_one_line(local_cluster):
    """An event past the last update would never happen and nothing would say so (on the session's
    cluster, for the reason the test above gives)."""
    c3 = local_cluster
    for start in (
        lambda: tfmagic.train(
            c3, "async", model="linear", steps=100, events="150: kill worker:1", block=False
        ),
        lambda: TrainingRun(c3, "async", model="linear", steps=100).schedule(step=101, restart="worker:1"),
    ):
        with pytest.raises(TrainingError, match=r"after the run's last update \(100\)") as err:
            start()
        assert "\n" not in str(err.value)
    with pytest.raises(TrainingError, match=r"a scheduled restart of ps:0 would end the run") as err:
        tfmagic.train(c3, "async", model="linear", steps=100, events="50: restart ps:0", block=False)
    assert "\n" not in str(err.value) and "50: kill ps:0" in str(err.value)
    run = tfmagic.train(c3, "async", model="linear", steps=20, events="20: slow worker:1 1", block=False)
    run.wait(120)
    assert [(str(e), e.done) for e in run.scheduled.events] == [("20: slow worker:1 1", True)]


def test_the_engines_retracing_stays_out_of_the_notebook_and_a_users_does_not(local_cluster):
    # Every run traces its step functions anew; after a few short runs TensorFlow warned "N out of
    # the last N calls to <function> triggered tf.function retracing" into the notebook, as if the
    # user's code were at fault. The engine's go to the kernel's log; a user's own still warn.
    import logging

    import tensorflow as tf

    seen: list[str] = []

    class Keep(logging.Handler):
        # (a full run's worker once had autograph convert this method as TensorFlow logged while
        # tracing `users` below, and call it without its record)
        @tf.autograph.experimental.do_not_convert
        def emit(self, record):
            seen.append(record.getMessage())

    logger = logging.getLogger("tensorflow")
    handler, level = Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        for i in range(7):
            run_to_end(
                local_cluster, "sync" if i % 2 else "async", model=Linear(), steps=2, name=f"short-{i}"
            )
        assert not [m for m in seen if "retracing" in m], seen

        @tf.function
        def users(x):
            return x * 2

        for n in range(8):
            users(tf.constant([1.0] * (n + 1)))  # a new shape each call: a new trace each time
            users(float(n))
        assert [m for m in seen if "retracing" in m], "a user's own retracing is still shown"
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
