"""Asynchronous training (Downpour): each worker applies its gradient as soon as it has it.

No worker waits for another.  Each update gets its own step number (an
atomic increment on the ps) and its **staleness**: how many updates by
others landed between the worker's read of the parameters and its apply.
A slow worker slows only itself; its gradients arrive staler.

:meth:`AsyncLoop.run` is the algorithm; reading the workers' step records
(a ring buffer on each worker, several steps per round trip) is its
bookkeeping.
"""

from __future__ import annotations

import threading
import time

from .. import client
from ..errors import TrainingError
from ..metrics import GlobalStep, StepRecord
from .params import clear_executor
from .steps import RING, SKIPPED, Worker, with_own_executor

#: how many steps' numbers are fetched from a worker in one round trip
FETCH_EVERY = 8
#: errors of a task coming or going (retried quietly), not of the step itself
CONNECTION_ERRORS = ("UnavailableError", "CancelledError", "AbortedError", "DeadlineExceededError")


class AsyncLoop:
    """One async run: a thread per worker steps as fast as that worker can."""

    def __init__(self, run) -> None:
        self.training = run
        self.control, self.history, self.params = run.control, run.history, run.params
        self.policy = run.policy
        self.steps = run.config.steps

    def run(self) -> None:
        """Every worker steps on its own until the ps has counted ``steps`` updates."""
        for w in self.policy.workers.values():
            w.thread = threading.Thread(
                target=with_own_executor(self.work), args=(w,), name=f"tfmagic-async-{w.task}", daemon=True
            )
            w.thread.start()
        last_check, seen = time.monotonic(), -1
        while not self.control.stopping:
            time.sleep(0.1)
            if self.policy.all_lost():
                self.control.fail(
                    TrainingError(
                        "every worker was lost; restart them (%tf_cluster restart worker:0 ...) and resume()"
                    )
                )
            self.training.checkpoint()
            if self.history.steps != seen:
                seen, last_check = self.history.steps, time.monotonic()
            elif time.monotonic() - last_check > 2.0:
                # the workers' rows end the run; if none could be read for a while, the ps says
                last_check = time.monotonic()
                step = self.params.read_step()
                if step is not None and step >= self.steps:
                    self.control.stop()
        for w in self.policy.workers.values():  # their last rows, before the weights are read
            if w.thread is not None:
                w.thread.join(2 if self.control.reason else 30)

    def work(self, w: Worker) -> None:
        """A worker's thread: one call per step; the steps' numbers read in batches.

        With a synchronous executor a call returns once the worker answered,
        which gives the step's end time; the step's (local step, loss, read
        step, new step) go into a ring buffer on the worker, read for several
        steps at once: one round trip saved per step.
        """
        import tensorflow as tf

        pending: list[tuple[float, float]] = []
        last_flush = time.monotonic()
        while not self.control.stopping:
            if (w.lost or w.rebuild) and not self.policy.wait_rejoin(w):
                pending.clear()
                continue
            t0 = time.time()
            try:
                with client.gate.call(self.training.who), tf.device(w.task.device):
                    w.fn()
            except Exception as exc:  # noqa: BLE001 - sorted out by the failure policy
                self.flush(w, pending)
                self.policy.handle_error(w, exc)
                continue
            pending.append((t0, time.time()))
            w.local_step += 1
            w.errors = 0
            if len(pending) >= FETCH_EVERY or time.monotonic() - last_flush > 0.1:
                self.flush(w, pending)
                last_flush = time.monotonic()
        if not self.control.reason:  # ended by the cluster going away: nothing left to read
            self.flush(w, pending, final=True)

    def flush(self, w: Worker, pending: list, final: bool = False) -> None:
        """Turn the ring's new rows into records; the run ends when a row shows the last update.

        The rows, written on the worker, are what happened: a call that
        returned here may still have failed there (TensorFlow reports a
        remote function's failure on a later op, e.g. while a restarted ps
        is not reachable yet), and a call that raised here may have run.
        So every new row is recorded, and none is made up for a call
        without one; ``pending`` (start and end time of the calls seen to
        succeed here) only gives the rows their times, newest with newest.

        A read can fail for a while after the cluster changed under the
        connection; the rows stay in the ring, so the next flush gets them
        (the last flush of a run tries a few times).
        """
        if not pending and not final:
            return
        rows = None
        error = None
        proc = self.training.cluster.procs.get(w.task)
        alive = proc is not None and proc.alive
        for _attempt in range(5 if final and alive else 1 if alive else 0):
            try:
                with client.gate.call(self.training.who):
                    rows = w.ring.numpy()
                break
            except Exception as exc:  # noqa: BLE001 - see the docstring
                clear_executor()
                error = exc
                if not proc.alive:
                    break  # the worker died with these numbers; the steps did happen
                if final:
                    time.sleep(0.1)
        if rows is None:
            if error is not None and not final and type(error).__name__ not in CONNECTION_ERRORS:
                # The steps' own failure, reported on this read (e.g. the worker's input ran
                # out): handled as a failed step, not retried silently forever.
                self.policy.handle_error(w, error)
            if final or not alive:
                pending.clear()
            else:
                del pending[:-RING]  # older rows are overwritten in the ring
            return
        fresh = sorted((r for r in rows if r[0] > w.seen_k), key=lambda r: r[0])
        if fresh:
            w.seen_k = int(fresh[-1][0])
        times = pending[-len(fresh) :] if fresh else []
        # rows without a call seen here (it raised here, yet ran there) take the earliest time known
        first = times[0] if times else (time.time(), time.time())
        times = [first] * (len(fresh) - len(times)) + times
        for (t0, t1), (k, loss, read, new) in zip(times, fresh, strict=True):
            new = int(new)
            if new == SKIPPED:  # came after the last update: nothing was applied
                self.control.stop()
                continue
            self.history.add_step(
                StepRecord(
                    w.task,
                    int(read),
                    t0,
                    t1,
                    float(loss),
                    mode="async",
                    local_step=int(k),
                    staleness=max(0, new - 1 - int(read)),
                    examples=self.training.config.batch_size,
                    update=new,
                )
            )
            self.history.add_global(GlobalStep(new, t1, float(loss), aggregated=(w.task,)))
            if not self.policy.check_loss(float(loss), new):
                break
            if new >= self.steps:
                self.control.stop()  # the last update: done
        pending.clear()
