"""Synchronous training: every update averages the gradients of one step, computed from the same parameters.

The semantics of the seeds' ``SyncReplicasOptimizer(replicas_to_aggregate,
total_num_replicas)``: each worker computes a gradient from the current
parameters; the first ``workers - backup_workers`` to arrive are averaged
and applied once on the ps; gradients that arrive later were computed from
old parameters and are dropped and counted.  The slowest worker of those
aggregated sets the pace.

Two loops carry it out:

* :class:`SyncLoop`, the general one: a thread per worker computes, this
  loop collects the first gradients to arrive and applies them.  It serves
  backup workers, paced clusters and lost workers rejoining.
* :class:`FusedSyncLoop`, when every worker takes part and nothing is
  paced: the whole update is one function called once (one round trip per
  update instead of three), with the same result.

Each loop's ``run`` is the algorithm; the rest is bookkeeping.
"""

from __future__ import annotations

import queue
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .. import client
from ..doctor import waits
from ..metrics import GlobalStep, StepRecord
from .params import clear_executor
from .steps import Worker, fused_update, make_apply, start_worker_thread

if TYPE_CHECKING:
    from .context import LoopContext

#: what :meth:`SyncLoop.wait_out_pace` returns for a step the update no longer waited for
CANCELLED = -1.0


@dataclass
class Gradient:
    """One worker's answer for one step (the gradient itself waits in its buffer on the ps)."""

    step: int
    worker: Worker
    loss: float
    start: float  # this process's clock: the call went out
    end: float  # the gradient counts as arrived (after the pace, when paced)
    device: tuple  # on-device timestamps: (t0, t_read, t_grad, t_pushed)
    returned: float  # the call came back
    paced: float | None = None  # the modelled step time


class SyncLoop:
    """One sync run: worker threads compute, this loop aggregates and applies."""

    def __init__(self, run: LoopContext) -> None:
        self.training = run
        self.control, self.history, self.params = run.control, run.history, run.params
        self.policy = run.policy
        self.pace = run.cluster.pace
        self.backups = run.config.backup_workers
        self.members: set = set()  # the workers taking part, as of the last step boundary
        self.current = -1  # the step the workers compute now
        self.started = 0.0  # when step `current` was announced
        self.overhead = 0.0  # apply + announce, learnt: a paced step ends that much early
        self.results: queue.Queue[Gradient] = queue.Queue()
        self.apply = make_apply(self.params)
        self.first = None
        self.cancel_late = run.config.late == "cancel"
        self.cancelled: Counter = Counter()  # steps stopped when the update went ahead without them, per task

    def run(self, first: int, last: int) -> None:
        """Updates ``first`` .. ``last - 1``: wait for enough gradients of each, average, apply."""
        self.first = first
        self.members = {w.task for w in self.policy.members()}
        for w in self.policy.members():
            self.start_worker(w)  # a thread per worker: `work`, below
        for t in range(first, last):
            self.reconcile(t)  # workers that joined or left since the last step
            self.announce(t)  # workers read the parameters of step t
            collected = self.collect(t)  # the first `replicas` gradients of step t, applied
            if collected is None:
                return  # stopped
            self.record(t, *collected)
            self.training.checkpoint()
        self.drain()  # what arrives late for the last step is dropped, and counted
        self.note_cancelled()

    @property
    def replicas(self) -> int:
        """Gradients each update averages: the workers taking part, less the backups (at least one:
        with as many backups as workers left, an update would average nothing)."""
        return max(1, len(self.policy.members()) - self.backups)

    @property
    def backups_now(self) -> int:
        """The backup workers in effect: fewer than asked once removals leave too few workers."""
        return len(self.policy.members()) - self.replicas

    def reconcile(self, t: int) -> None:
        """At a step boundary: a worker leaving with ``drain`` has finished its last step and goes;
        a worker that joined gets its gradient buffers and step function and computes step ``t``.

        The replica count changes here, and the change is recorded on the run's history.
        """
        joined = False
        self.policy.no_respread("the per-worker sync loop keeps gradient buffers beside the variables")
        for w in list(self.policy.workers.values()):
            if w.leaving and w.drain and not w.retired:
                w.drain = False  # step t - 1 was its last: no gradient of it counts from here
            elif not w.joined and not w.retired and not w.leaving:
                self.params.add_buffers(w.index + 1)
                self.training.place(w)
                w.joined, w.rebuild = True, False
                joined = True
                self.start_worker(w)
        if joined:
            self.apply = make_apply(self.params)  # averages over the new set of buffers
        with self.control.cond:
            self.control.cond.notify_all()  # leaving workers' threads end
        now = {w.task for w in self.policy.members()}
        if now != self.members:
            n = f"{self.replicas} replicas per update from here"
            if self.backups_now < self.backups:
                n += f" (backup workers {self.backups_now}, not {self.backups}: {len(now)} left to compute)"
            for task in sorted(now - self.members):
                self.history.add_event("joined", task, n, step=t)
            for task in sorted(self.members - now):
                self.history.add_event("left", task, n, step=t)
            self.members = now

    # -- the workers' side ------------------------------------------------------
    def work(self, w: Worker) -> None:
        """A worker's thread: for each new step, one call that computes its gradient there."""
        while self.next_step(w):
            step, announced = self.current, self.started
            t0 = time.time()
            try:
                loss, read, *device = self.compute(w, step)  # read the parameters, gradient into its buffer
            except Exception as exc:  # noqa: BLE001 - sorted out by the failure policy
                self.policy.handle_error(w, exc)
                continue
            returned = time.time()
            end, modelled = self.wait_out_pace(w, step, announced, returned)
            if end is None:
                return  # stopped while the modelled machine still worked
            if end == CANCELLED:
                w.last_step = step  # the update went ahead without it: on to the next step
                continue
            w.errors = 0
            w.last_step = step
            w.local_step += 1
            self.results.put(Gradient(int(read), w, float(loss), t0, end, tuple(device), returned, modelled))

    def start_worker(self, w: Worker) -> None:
        start_worker_thread(w, self.work, self.policy, "sync")

    def announce(self, t: int) -> None:
        with self.control.cond:
            self.current, self.started = t, time.time()
            self.control.cond.notify_all()

    def next_step(self, w: Worker) -> bool:
        """Wait until a step ``w`` has not computed is announced (and ``w`` can reach its task);
        False when the run stops or ``w`` leaves."""
        while not self.control.stopping and not (w.dropping or w.retired):
            with self.control.cond:
                while not self.control.stopping and self.current <= w.last_step and not w.dropping:
                    self.control.cond.wait(0.2)
            if self.control.stopping or w.dropping or w.retired:
                return False
            if (w.lost or w.rebuild) and not self.policy.wait_rejoin(w):
                continue
            return True
        return False

    def compute(self, w: Worker, step: int):
        """One call to worker ``w``: its loss, the step it read and the on-device timestamps."""
        import tensorflow as tf

        with client.gate.call(self.training.who, [w.task], f"step {step}"), tf.device(w.task.device):
            return w.fn().numpy()

    def wait_out_pace(
        self, w: Worker, step: int, announced: float, returned: float
    ) -> tuple[float | None, float | None]:
        """On a paced cluster the modelled machine takes its time (the call counts in it): when the
        gradient counts as arrived, and the modelled step time; (None, _) if the run stopped meanwhile,
        (CANCELLED, _) if the update went ahead without this step and ``late="cancel"`` stops it."""
        if self.pace is None:
            return returned, None
        modelled = self.pace.duration(w.task, w.local_step)
        end = max(returned, announced + modelled - self.overhead)
        if not self.cancel_late:
            if self.control.stopped.wait(end - returned):
                return None, modelled
            return max(end, time.time()), modelled
        with self.control.cond:  # announce() notifies: a newer step means this one is no longer waited for
            while True:
                if self.control.stopping:
                    return None, modelled
                if self.current > step:  # also when the call itself came back after the update
                    self.cancelled[w.task] += 1
                    return CANCELLED, modelled
                if (left := end - time.time()) <= 0:
                    return max(end, time.time()), modelled
                self.control.cond.wait(left)

    # -- the aggregator's side ---------------------------------------------------
    def collect(self, t: int) -> tuple[list[Gradient], tuple] | None:
        """The first ``replicas`` gradients for step ``t``, averaged and applied (and the apply's
        timestamps); None if stopped."""

        collected: list[Gradient] = []
        with waits.waiting(
            f"sync step {t} of training run {self.training.name}", [], "", self.training.cluster.id
        ) as wait:
            return self._collect(t, collected, wait)

    def _collect(self, t: int, collected: list[Gradient], wait: int):
        import tensorflow as tf

        attempts = 0  # applies that failed while every task lived (a connection broken under the call)
        while True:
            while len(collected) < self.replicas:
                if self.control.stopping:
                    return None
                collected[:] = [r for r in collected if not r.worker.dropping]  # left without --drain
                have = {r.worker.task for r in collected}
                missing = [w.task for w in self.policy.workers.values() if w.task not in have and not w.lost]
                waits.update(wait, missing, f"{len(collected)} of {self.replicas} gradients so far")
                self.policy.check_enough_workers(t, self.replicas)
                try:
                    res = self.results.get(timeout=0.1)
                except queue.Empty:
                    continue
                if res.step == t and not res.worker.lost and not res.worker.dropping:
                    collected.append(res)
                elif res.step != t:
                    self.late_gradient(res)
                    if res.step > t and self.was_applied(t):
                        return collected, (time.time(), None, None)  # the ps is past t: it happened
            chosen = [0.0] * len(self.params.buffers)
            for r in collected:  # each one's weight in the average (make_apply)
                chosen[r.worker.index] = self.training.config.weight_of(r.worker.task)
            try:
                a0 = time.time()
                on = self.params.ps_tasks
                with (
                    client.gate.call(self.training.who, on, f"the update of step {t}"),
                    tf.device(on[0].device),
                ):
                    _, ps0, ps1 = self.apply(tf.constant(chosen)).numpy()
                return collected, (a0, ps0, ps1)
            except Exception as exc:
                clear_executor()
                if self.control.stopping:
                    return None
                for r in collected:
                    proc = self.training.cluster.procs.get(r.worker.task)
                    if proc is not None:
                        proc.wait_for(lambda p=proc: not p.alive, 1.0)
                    if proc is None or not proc.alive:
                        r.worker.lost = True
                dead = self.params.dead_ps()
                if dead is not None:
                    raise self.policy.ps_lost(dead) from None
                if self.was_applied(t):
                    # The update ran; the failure was another call's, reported on this one.
                    # Collecting again would wait forever: the workers that took part are
                    # done with step t, the others now read t + 1.
                    return collected, (a0, None, None)
                if not any(r.worker.lost for r in collected):
                    # every task lives: the call's connection broke (the relay restarted, a socket closed);
                    # the gradients are still in their buffers, so the same update goes out again
                    if not self.policy.retry_call(f"the update of step {t}", exc, attempts):
                        raise
                    attempts += 1
                    continue
                collected = [r for r in collected if not r.worker.lost]

    def was_applied(self, t: int) -> bool:
        """Whether the ps already holds step ``t``'s update.

        TensorFlow can report a failure on a later call than the one that
        failed (seen here: an apply raised after a worker was killed, yet the
        ps had counted the step), so after a failed apply the ps is asked.
        """
        step = self.params.settled_step()
        return step is not None and step > t

    def record(self, t: int, collected: list[Gradient], applied: tuple) -> None:
        a0, ps0, ps1 = applied
        now = time.time()
        apply_s = None if ps0 is None else ps1 - ps0
        warm = t == self.first
        if apply_s is not None and not warm:  # the apply and the next announcement: what a paced step
            # leaves for them (not learnt from the first update, which traces: seconds, not milliseconds)
            self.overhead = 0.8 * self.overhead + 0.2 * (now - a0)
        for r in collected:
            d0, d_read, d_grad, d_pushed = r.device
            self.history.add_step(
                StepRecord(
                    r.worker.task,
                    t,
                    r.start,
                    r.end,
                    r.loss,
                    mode="sync",
                    local_step=r.worker.local_step,
                    applied=True,
                    examples=self.training.config.batch_of(r.worker.task),
                    update=t + 1,
                    compute=d_grad - d_read,
                    transfer=(d_read - d0) + (d_pushed - d_grad),
                    wait=max(0.0, a0 - r.end),
                    apply=apply_s,
                    engine=max(0.0, (r.returned - r.start) - (d_pushed - d0)) + (now - a0 - (apply_s or 0.0)),
                    paced=r.paced,
                    warmup=warm,
                )
            )
        loss = float(
            np.average(
                [r.loss for r in collected],
                weights=[self.training.config.weight_of(r.worker.task) for r in collected],
            )
        )
        self.history.add_global(
            GlobalStep(t + 1, now, loss, aggregated=tuple(r.worker.task for r in collected))
        )
        if warm:
            self.history.warmup_ended_at = now
        self.policy.check_loss(loss, t + 1)

    def late_gradient(self, res: Gradient) -> None:
        """A gradient of a step already applied: dropped and recorded (SyncReplicasOptimizer), or with
        ``late="cancel"`` counted as a stopped step (it came in between the update and the next step's
        start, before its worker could be stopped)."""
        if self.cancel_late:
            self.cancelled[res.worker.task] += 1
        else:
            self.record_dropped(res)

    def record_dropped(self, res: Gradient) -> None:
        self.history.add_step(
            StepRecord(
                res.worker.task,
                res.step,
                res.start,
                res.end,
                res.loss,
                mode="sync",
                local_step=res.worker.local_step,
                applied=False,
                dropped=True,
                examples=self.training.config.batch_of(res.worker.task),
                paced=res.paced,
            )
        )
        self.history.add_event(
            "dropped", res.worker.task, f"stale gradient of step {res.step}", step=res.step
        )

    def drain(self) -> None:
        while True:
            try:
                self.late_gradient(self.results.get_nowait())
            except queue.Empty:
                break

    def note_cancelled(self) -> None:
        """With ``late="cancel"``: how many steps stopped when the update went ahead without them."""
        if self.cancelled:
            per = ", ".join(
                f"{task} {n}" for task, n in sorted(self.cancelled.items(), key=lambda kv: str(kv[0]))
            )
            self.history.notes.append(
                f"late='cancel': {sum(self.cancelled.values())} steps stopped when the update went ahead "
                f"without them ({per})"
            )


class FusedSyncLoop:
    """Sync with every worker taking part and no pace: one call per update does all of it."""

    def __init__(self, run: LoopContext) -> None:
        self.training = run
        self.control, self.history, self.params = run.control, run.history, run.params
        self.policy = run.policy
        self.workers = self.policy.members()
        per_call = run.config.steps_per_call
        # every worker's gradient, the average, the apply: per_call updates per call
        self.update = fused_update(run.model, self.params, self.workers, per_call, self.weights())
        self.single = (
            (lambda: self.update)
            if per_call == 1
            else (lambda: fused_update(run.model, self.params, self.workers, 1, self.weights()))
        )

    def weights(self) -> list[float] | None:
        """Each worker's batch size when they differ (a weighted average), else None (a plain one)."""
        config = self.training.config
        return [config.weight_of(w.task) for w in self.workers] if config.weighted else None

    def run(self, first: int, last: int) -> None:
        """Updates ``first`` .. ``last - 1``: each one call that computes, averages and applies."""
        import tensorflow as tf

        done = None  # the updates whose numbers are recorded while the next call runs
        per_call = self.training.config.steps_per_call
        t, attempts = first - per_call, 0
        while True:
            if attempts == 0:
                t += per_call
            if t >= last or self.control.stopping:
                break
            if self.changed():
                since = done[3] if done is not None else time.time()  # the last call returned
                if done is not None:  # recorded against the workers that made it
                    self.record(*done)
                    done = None
                if self.policy.respread_pending:  # a ps joined or is leaving: one call per update, so
                    # between two calls nothing is in flight: this is the pause
                    self.policy.respread(t, replace_workers=False, paused_at=since)
                self.reconcile(t, per_call)
            if t + per_call > last:  # the last few updates: one call each (another function)
                per_call, self.update = 1, self.single()
            c0 = time.time()
            try:
                on = [*self.params.ps_tasks, *(w.task for w in self.workers)]
                with client.gate.call(self.training.who, on, f"sync update {t}"), tf.device(on[0].device):
                    handle = self.update()  # goes out at once; this process records the last one meanwhile
                    if done is not None:
                        self.record(*done)
                        done = None
                    out = handle.numpy()
            except Exception as exc:  # noqa: BLE001 - a lost task: the policy says what it means
                held = self.failed(t, exc, attempts, per_call)
                if held is None:
                    return
                attempts += 1
                t += held  # those reached the ps (their reply was lost); the call goes out for the rest
                continue
            attempts = 0
            done = (t, out, c0, time.time())
            self.training.checkpoint()
        if done is not None:
            self.record(*done)

    def changed(self) -> bool:
        """Whether a worker joined or is leaving since the function was built."""
        return self.policy.respread_pending or any(
            (w.leaving and not w.retired) or (not w.joined and not w.retired)
            for w in self.policy.workers.values()
        )

    def reconcile(self, t: int, per_call: int) -> None:
        """At an update boundary: the leaving workers go (their last update is applied: a fused
        update is never cut in half), the new ones are placed, the function is built for the new set."""
        before = {w.task for w in self.workers}
        for w in list(self.policy.workers.values()):
            if w.leaving and not w.retired:
                self.policy.retire(w)
            elif not w.joined and not w.retired:
                self.training.place(w)
                w.joined, w.rebuild = True, False
        self.workers = sorted(self.policy.members(), key=lambda w: w.index)
        model, params = self.training.model, self.params
        weights = self.weights()
        self.update = fused_update(model, params, self.workers, per_call, weights)
        self.single = (
            (lambda: self.update)
            if per_call == 1
            else (lambda: fused_update(model, params, self.workers, 1, weights))
        )
        now = {w.task for w in self.workers}
        n = f"{len(self.workers)} replicas per update from here"
        for task in sorted(now - before):
            self.history.add_event("joined", task, n, step=t)
        for task in sorted(before - now):
            self.history.add_event("left", task, n, step=t)

    def failed(self, t: int, exc: Exception, attempts: int, per_call: int) -> int | None:
        """After the call for updates ``t`` .. ``t + per_call - 1`` failed: how many of them the ps holds
        when it may go on (every task lives: the call's connection broke, e.g. the relay restarted), None
        when the run is stopping. Otherwise raises, saying what was lost.

        Updates the ps holds whose reply was lost are counted, not made up: ``History.unrecorded``.
        """
        clear_executor()
        if self.control.stopping:
            return None
        procs = self.training.cluster.procs
        deadline = time.monotonic() + 1.0  # a task dying right now: give the owner a moment to see it
        for proc in list(procs.values()):
            proc.wait_for(lambda p=proc: not p.alive, max(0.0, deadline - time.monotonic()))
        dead = self.params.dead_ps()
        if dead is not None:
            raise self.policy.ps_lost(dead) from None
        for w in self.workers:
            proc = self.training.cluster.procs.get(w.task)
            if proc is not None:
                proc.wait_for(lambda p=proc: not p.alive, 1.0)
            if proc is None or not proc.alive:
                w.lost = True
        self.policy.check_enough_workers(t, len(self.workers))  # raises, naming the lost worker
        step = self.params.settled_step(attempts=50)  # a restarting relay answers again within seconds
        if step is not None and t <= step <= t + per_call:
            held = step - t
            what = f"sync update {t}" if per_call == 1 else f"sync updates {t}-{t + per_call - 1}"
            if self.policy.retry_call(what, exc, attempts, reached=held):
                return held
        raise self.policy.explain(exc, f"sync update {t} failed")

    def record(self, t: int, outs, c0: float, c1: float) -> None:
        outs = np.asarray(outs)
        first_t0 = float(outs[0, 3 + 2 :: 6].min())
        engine = max(0.0, (c1 - c0) - (float(outs[-1, 2]) - first_t0)) / len(outs)  # per update
        for out in outs:
            self.record_one(out, engine, c1)

    def record_one(self, out, shared_engine: float, c1: float) -> None:
        newk, a0, a1 = out[:3]
        heads = out[3:].reshape(len(self.workers), 6)
        warm = not self.history.global_steps
        for w, (loss, read, d0, d_read, d_grad, arrived) in zip(self.workers, heads, strict=True):
            w.local_step += 1
            self.history.add_step(
                StepRecord(
                    w.task,
                    int(read),
                    float(d0),
                    float(arrived),
                    float(loss),
                    mode="sync",
                    local_step=w.local_step,
                    applied=True,
                    examples=self.training.config.batch_of(w.task),
                    update=int(newk),
                    compute=float(d_grad - d_read),
                    transfer=float((d_read - d0) + (arrived - d_grad)),
                    wait=float(max(0.0, a0 - arrived)),
                    apply=float(a1 - a0),
                    engine=shared_engine,
                    warmup=warm,
                )
            )
        loss = float(
            np.average(heads[:, 0], weights=[self.training.config.weight_of(w.task) for w in self.workers])
        )
        self.history.add_global(
            GlobalStep(int(newk), c1, loss, aggregated=tuple(w.task for w in self.workers))
        )
        if warm:
            self.history.warmup_ended_at = c1
        self.policy.check_loss(loss, int(newk))
