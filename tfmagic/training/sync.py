"""Synchronous training: every update averages the gradients of one step, computed from the same parameters.

The semantics of the seeds' ``SyncReplicasOptimizer(replicas_to_aggregate,
total_num_replicas)``: each worker computes a gradient from the current
parameters; the first ``workers - backup_workers`` to arrive are averaged
and applied once on the ps; gradients that arrive later were computed from
old parameters and are dropped and counted.  The slowest worker of those
aggregated sets the pace.

:meth:`SyncLoop.run` is the algorithm; the rest is its bookkeeping.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

import numpy as np

from .. import client
from ..metrics import GlobalStep, StepRecord
from .params import clear_executor
from .steps import Worker, make_apply, with_own_executor


@dataclass
class Gradient:
    """One worker's answer for one step (the gradient itself waits in its buffer on the ps)."""

    step: int
    worker: Worker
    loss: float
    start: float
    end: float


class SyncLoop:
    """One sync run: worker threads compute, this loop aggregates and applies."""

    def __init__(self, run) -> None:
        self.training = run
        self.control, self.history, self.params = run.control, run.history, run.params
        self.policy = run.policy
        self.replicas = run.workers_n - run.config.backup_workers
        self.current = -1  # the step the workers compute now
        self.results: queue.Queue[Gradient] = queue.Queue()
        self.apply = make_apply(self.params)

    def run(self, first: int, last: int) -> None:
        """Updates ``first`` .. ``last - 1``: wait for enough gradients of each, average, apply."""
        self.start_workers()
        for t in range(first, last):
            self.announce(t)  # workers read the parameters of step t
            collected = self.collect(t)  # the first `replicas` gradients of step t, applied
            if collected is None:
                return  # stopped
            self.record(t, collected)
            self.training.checkpoint()
        self.drain()  # what arrives late for the last step is dropped, and counted

    # -- the workers' side ------------------------------------------------------
    def start_workers(self) -> None:
        for w in self.policy.workers.values():
            w.thread = threading.Thread(
                target=with_own_executor(self.work), args=(w,), name=f"tfmagic-sync-{w.task}", daemon=True
            )
            w.thread.start()

    def announce(self, t: int) -> None:
        with self.control.cond:
            self.current = t
            self.control.cond.notify_all()

    def work(self, w: Worker) -> None:
        """A worker's thread: for each new step, one call that computes its gradient there."""
        import tensorflow as tf

        while not self.control.stopping:
            with self.control.cond:
                while not self.control.stopping and self.current <= w.last_step:
                    self.control.cond.wait(0.2)
            if self.control.stopping:
                return
            if (w.lost or w.rebuild) and not self.policy.wait_rejoin(w):
                continue
            step = self.current
            t0 = time.time()
            try:
                with client.gate.call(self.training.who), tf.device(w.task.device):
                    loss, read = w.fn().numpy()
            except Exception as exc:  # noqa: BLE001 - sorted out by the failure policy
                self.policy.handle_error(w, exc)
                continue
            w.errors = 0
            w.last_step = step
            w.local_step += 1
            self.results.put(Gradient(int(read), w, float(loss), t0, time.time()))

    # -- the aggregator's side ---------------------------------------------------
    def collect(self, t: int) -> list[Gradient] | None:
        """The first ``replicas`` gradients for step ``t``, averaged and applied; None if stopped."""
        import tensorflow as tf

        collected: list[Gradient] = []
        while True:
            while len(collected) < self.replicas:
                if self.control.stopping:
                    return None
                self.policy.check_enough_workers(t, self.replicas)
                try:
                    res = self.results.get(timeout=0.1)
                except queue.Empty:
                    continue
                if res.step == t and not res.worker.lost:
                    collected.append(res)
                elif res.step != t:
                    self.record_dropped(res)
                    if res.step > t and self.was_applied(t):
                        return collected  # the ps is past t: step t's update happened
            try:
                chosen = [0.0] * self.training.workers_n
                for r in collected:
                    chosen[r.worker.index] = 1.0
                with client.gate.call(self.training.who), tf.device(self.params.ps_tasks[0].device):
                    self.apply(tf.constant(chosen)).numpy()
                return collected
            except Exception:
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
                    return collected
                if not any(r.worker.lost for r in collected):
                    raise
                collected = [r for r in collected if not r.worker.lost]

    def was_applied(self, t: int) -> bool:
        """Whether the ps already holds step ``t``'s update.

        TensorFlow can report a failure on a later call than the one that
        failed (seen here: an apply raised after a worker was killed, yet the
        ps had counted the step), so after a failed apply the ps is asked.
        """
        for _attempt in range(5):
            step = self.params.read_step()
            if step is not None:
                return step > t
            time.sleep(0.1)
        return False

    def record(self, t: int, collected: list[Gradient]) -> None:
        now = time.time()
        for r in collected:
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
                    examples=self.training.config.batch_size,
                    update=t + 1,
                )
            )
        loss = float(np.mean([r.loss for r in collected]))
        self.history.add_global(
            GlobalStep(t + 1, now, loss, aggregated=tuple(r.worker.task for r in collected))
        )
        self.policy.check_loss(loss, t + 1)

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
                examples=self.training.config.batch_size,
            )
        )
        self.history.add_event(
            "dropped", res.worker.task, f"stale gradient of step {res.step}", step=res.step
        )

    def drain(self) -> None:
        while True:
            try:
                self.record_dropped(self.results.get_nowait())
            except queue.Empty:
                break
