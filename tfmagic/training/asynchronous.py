"""Asynchronous training (Downpour): each worker applies its gradient as soon as it has it.

No worker waits for another.  Each update gets its own step number (an
atomic increment on the ps) and its **staleness**: how many updates by
others landed between the worker's read of the parameters and its apply.
A slow worker slows only itself; its gradients arrive staler.

**Stale synchronous parallel** (SSP, Ho et al. 2013) is the same loop with
one rule added: no worker may run more than ``staleness`` steps ahead of
the slowest (sync is 0, async is no bound).

:meth:`AsyncLoop.run` and :meth:`AsyncLoop.work` are the algorithm;
reading the workers' step records (a ring buffer on each worker, several
steps per round trip) is its bookkeeping.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import client
from ..metrics import GlobalStep, StepRecord
from .params import clear_executor
from .steps import RING, SKIPPED, Worker, join_worker_threads, start_worker_thread

if TYPE_CHECKING:
    from .context import LoopContext

#: how many steps' numbers are fetched from a worker in one round trip
FETCH_EVERY = 8
#: errors of a task coming or going (retried quietly), not of the step itself
CONNECTION_ERRORS = ("UnavailableError", "CancelledError", "AbortedError", "DeadlineExceededError")


#: seconds of a thread's bookkeeping after a paced step that count inside the next step (more means
#: the thread was held up, and its next step starts when it really does)
CARRY = 0.05


@dataclass
class Unread:
    """A worker thread's steps whose numbers are still in the worker's ring."""

    #: the modelled time of each step made since the last read (None: not paced)
    pending: list = field(default_factory=list)
    #: paced: the modelled time of the step whose gradient is in flight
    held: float | None = None
    last_flush: float = field(default_factory=time.monotonic)
    #: paced: when the modelled step just waited out ended; the next step starts there, so the
    #: thread's own bookkeeping between two calls (reading the ring, the bound) counts inside the
    #: next modelled step as it would on a real machine, instead of lengthening every step by it
    #: (measured: async ran 4-6 % slower than its modelled rate)
    ended: float | None = None


class AsyncLoop:
    """One async run: a thread per worker steps as fast as that worker can."""

    def __init__(self, run: LoopContext) -> None:
        self.training = run
        self.control, self.history, self.params = run.control, run.history, run.params
        self.policy = run.policy
        self.steps = run.config.steps
        self.pace = run.cluster.pace
        self.bound = run.config.staleness if run.mode == "ssp" else None  # SSP: steps ahead of the slowest
        self.per_call = run.config.steps_per_call
        self.pausing = threading.Event()  # a ps joined: every worker stops stepping while variables move
        self.idle: set = set()

    def run(self) -> None:
        """Every worker steps on its own until the ps has counted ``steps`` updates."""
        for w in self.policy.members():
            self.start_worker(w)  # a thread per worker: `work`, below
        last_check, seen = time.monotonic(), -1
        while not self.control.stopping:
            time.sleep(0.1)
            self.start_joined()
            if self.policy.respread_pending:  # a ps joined, or one is leaving with variables of this run
                if self.pace is not None:
                    self.policy.no_respread("a paced run holds gradients in flight between its calls")
                else:
                    self.pause_and_respread()
            if self.policy.all_lost():
                self.control.fail(self.policy.all_lost_error())
            self.training.checkpoint()
            if self.history.steps != seen:
                seen, last_check = self.history.steps, time.monotonic()
            elif time.monotonic() - last_check > 2.0:
                # the workers' rows end the run; if none could be read for a while, the ps says
                last_check = time.monotonic()
                step = self.params.read_step()
                if step is not None and step >= self.steps:
                    self.control.stop()
        join_worker_threads(self.policy.workers.values(), self.control)  # their last rows, then the weights
        self.count_unrecorded()

    def count_unrecorded(self) -> None:
        """Updates the ps applied whose rows were still on a worker when it was killed.

        A worker writes each step's numbers into a ring on itself, read a few steps at a time; a
        worker killed between two reads takes the last rows with it, though the ps applied those
        updates (a run then ended "done, 2997/3000 updates"). The ps's step counter is the truth:
        the difference is counted in ``History.unrecorded`` and said in a note, never made up.
        """
        lost = sorted(
            {
                str(e.task)
                for e in self.history.events
                if e.kind in ("kill", "lost") and str(e.task).startswith("worker:")
            }
        )
        if not lost:
            return
        step = self.params.settled_step()
        if step is None:
            return
        recorded = {g.step for g in self.history.global_steps}
        # Workers that computed while the last numbers went take one past the end too, and apply
        # nothing (the mask in steps._count_and_apply): the counter can pass the run's end.
        applied = min(step, self.steps)
        first = self.training.start_step + 1  # a resumed run records from its checkpoint on
        missing = len(set(range(first, applied + 1)) - recorded)
        if missing:
            self.history.unrecorded = missing
            self.history.notes.append(
                f"{missing} of the {applied} updates the ps applied have no record: they were made by "
                f"{' or '.join(lost)} just before it was lost, and their numbers were still on it"
            )

    def start_joined(self) -> None:
        """A worker that joined the cluster starts stepping at once (its thread places it first)."""
        for w in list(self.policy.workers.values()):
            if w.thread is None and not w.retired and not w.leaving:
                self.start_worker(w)

    def start_worker(self, w: Worker) -> None:
        start_worker_thread(w, self.work, self.policy, "async")

    def pause_and_respread(self, timeout: float = 10.0) -> None:
        """Pause every stepping worker (its call in flight returns, its rows are read), move the
        variables over the new ps set (onto a ps that joined, off one that is leaving), and let the
        workers go on (each placed again first)."""
        paused_at = time.time()
        self.pausing.set()
        try:
            deadline = time.monotonic() + timeout

            def busy():
                return [
                    w
                    for w in list(self.policy.workers.values())
                    if w.thread is not None
                    and w.thread.is_alive()
                    and not (w.lost or w.retired)
                    and w.task not in self.idle
                ]

            while busy() and time.monotonic() < deadline and not self.control.stopping:
                time.sleep(0.01)
            if self.control.stopping:
                return
            if busy():
                self.policy.no_respread(
                    f"{', '.join(w.task for w in busy())} did not pause within {timeout:g} s"
                )
                return
            self.policy.respread(self.training.step_now(), paused_at=paused_at)
        finally:
            self.pausing.clear()

    def work(self, w: Worker) -> None:
        """A worker's thread: step as fast as this worker can (or its modelled machine, when paced).

        Each call makes ``per_call`` steps there: read the parameters, compute
        the gradient, apply it on the ps.  Nothing waits for another worker
        (SSP's bound aside).  The steps' numbers go into a ring buffer on the
        worker, read several steps at a time (``unread``).
        """
        unread = Unread()
        while not self.control.stopping and not w.leaving:
            if not self.may_step(w, unread):  # variables moving, w lost, or (SSP) too far ahead
                unread.ended = None  # it waited: its next step starts when it really does
                continue
            t0 = self.start_time(unread)
            try:
                fn = self.step(w)  # the call: per_call steps on the worker
            except Exception as exc:  # noqa: BLE001 - sorted out by the failure policy
                self.flush(w, unread.pending)
                self.policy.handle_error(w, exc)
                w.started = False
                continue
            if self.pace is None:
                unread.pending.extend([None] * self.per_call)
                w.landed = w.local_step + self.per_call  # the call applied them (SSP waits for it)
            elif not self.wait_out_pace(w, fn, unread, t0):
                break  # stopped while the modelled machine still worked
            w.local_step += self.per_call
            w.errors = 0
            self.flush_now_and_then(w, unread)
        self.finish(w, unread)

    def may_step(self, w: Worker, unread: Unread) -> bool:
        """Whether ``w`` may make its next call now; when not, it has waited a little (the caller loops)."""
        if self.pausing.is_set():  # variables are moving: nothing in flight, every row read
            self.flush(w, unread.pending, final=True)
            self.idle.add(w.task)
            while self.pausing.is_set() and not self.control.stopping:
                self.control.stopped.wait(0.01)
            self.idle.discard(w.task)
            return False
        if (w.lost or w.rebuild) and not self.policy.wait_rejoin(w):
            unread.pending.clear()
            w.started = False
            return False
        if self.bound is not None and not self.within_bound(w):
            if self.pace is not None and w.started:
                # ssp: this worker's step has ended; its gradient lands now, not after the wait
                self.finish_paced(w, unread.pending, unread.held)
                w.started = False
            return False
        return True

    def step(self, w: Worker):
        """One call to ``w``; returns the function it ran.  Calls go out without waiting for their
        answer (TensorFlow queues them to the worker in order), except where the loop must know a
        step is done: a pace to keep, a bound to hold.  On a paced cluster a call applies the
        previous step's gradient and computes the next (the first call only computes)."""
        import tensorflow as tf

        fn = w.fn if (self.pace is None or w.started) else w.fn_first
        with client.gate.call(self.training.who, [w.task], "an async step"), tf.device(w.task.device):
            out = fn()
            if self.pace is not None:
                made = out.numpy()  # (steps, seconds applying, seconds reading): paced_steps
                w.comm = (float(made[1]), float(made[2]))
            elif self.bound is not None:
                out.numpy()
        return fn

    def links_modelled(self) -> bool:
        """Whether the cluster's network is modelled (``net=``): then a paced step's gradient and
        parameters take what its links give them, beside the modelled computation."""
        return bool(self.training.cluster.net_models)

    def start_time(self, unread: Unread) -> float:
        """When this step starts: now, or on a paced cluster the end of the step just waited out when
        the thread came straight back (its bookkeeping since then belongs to this step)."""
        now = time.time()
        if unread.ended is not None and 0 <= now - unread.ended < CARRY:
            return unread.ended
        return now

    def wait_out_pace(self, w: Worker, fn, unread: Unread, t0: float) -> bool:
        """Paced: wait out the modelled step (its gradient lands at its end); False if stopped meanwhile."""
        # On a modelled network a step is its reading, its modelled computation and its applying: the
        # links' times (a card that is full queues them) come on top of the pace, as on real machines;
        # on loopback alone they are the machine's and stay inside the pace.
        applying, reading = w.comm if self.links_modelled() else (0.0, 0.0)
        if fn is not w.fn_first:  # this call applied the step the previous call computed
            unread.pending.append(unread.held + applying)
            w.landed = w.local_step
        unread.held = self.pace.duration(w.task, w.local_step) + reading
        due = t0 + applying + unread.held
        late = time.time() > due  # the call itself ran past the modelled step: the next starts anew
        if self.control.stopped.wait(max(0.0, due - time.time())):
            return False
        unread.ended = None if late else due
        w.started = True
        return True

    def flush_now_and_then(self, w: Worker, unread: Unread) -> None:
        """Read the ring every ``FETCH_EVERY`` steps or 0.1 s, whichever comes first."""
        if len(unread.pending) >= FETCH_EVERY or time.monotonic() - unread.last_flush > 0.1:
            self.flush(w, unread.pending)
            unread.last_flush = time.monotonic()

    def finish(self, w: Worker, unread: Unread) -> None:
        """The thread's end: a paced gradient still held is applied, the last rows read."""
        if self.pace is not None and w.started and not self.control.reason and not w.dropping:
            self.finish_paced(w, unread.pending, unread.held)  # leaving without --drain drops it
        if not self.control.reason:  # ended by the cluster going away: nothing left to read
            self.flush(w, unread.pending, final=True)

    def warmed(self) -> None:
        """Warm-up ends when every running worker has made its first call (tracing, connections)."""
        if self.history.warmup_ended_at is None:
            ends = [x.warm_end for x in self.policy.workers.values() if not x.lost]
            if ends and all(e is not None for e in ends):
                self.history.warmup_ended_at = max(ends)

    def within_bound(self, w: Worker) -> bool:
        """SSP: whether ``w`` may start its next step (at most ``bound`` steps ahead of the slowest).

        A worker's clock is its steps whose updates are on the ps (``landed``),
        as in the paper, where a worker's clock ticks once its updates are
        committed: on a paced cluster a computed step's gradient lands only with
        the worker's next call, and counting it earlier let updates be staler
        than the bound (a staleness of 5 with bound 0 and 4 workers, where the
        rule allows 3).  A lost worker does not hold the others back.  Waits a
        little when not, so the caller loops.
        """
        alive = [x.landed for x in self.policy.workers.values() if not x.lost]
        if not alive or w.local_step - min(alive) <= self.bound:
            return True
        with self.control.cond:
            self.control.cond.wait(0.01)
        return False

    def finish_paced(self, w: Worker, pending: list, held: float | None = None) -> None:
        """The gradient still held at the end of a paced run is applied (or masked past the last update)."""
        import tensorflow as tf

        try:
            with client.gate.call(self.training.who), tf.device(w.task.device):
                made = w.fn_last().numpy()
            applying = float(made[1]) if self.links_modelled() else 0.0
            pending.append(held + applying if held is not None else None)
            w.landed = w.local_step
        except Exception:  # noqa: BLE001 - a worker lost at the very end: its last step is lost with it
            clear_executor()

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
                with client.gate.call(self.training.who, [w.task], "its step records"):
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
        modelled = pending[-len(fresh) :] if fresh else []
        # rows without a call seen here (it raised here, yet ran there) take no modelled time
        modelled = [None] * (len(fresh) - len(modelled)) + modelled
        for paced, (k, loss, read, new, d0, d_read, d_grad, d_applied) in zip(modelled, fresh, strict=True):
            new = int(new)
            if new == SKIPPED:  # came after the last update: nothing was applied
                self.control.stop()
                continue
            # on-device times: the step read at d0 and applied at d_applied (a pace later, when paced);
            # the worker's idle time before it (calls, this process) is the engine's share
            start, end = float(d0), float(d_applied)
            engine = None if w.device_end is None or paced is not None else max(0.0, start - w.device_end)
            w.device_end = end
            self.history.add_step(
                StepRecord(
                    w.task,
                    int(read),
                    start,
                    end,
                    float(loss),
                    mode=self.training.mode,
                    local_step=int(k),
                    staleness=max(0, new - 1 - int(read)),
                    examples=self.training.config.batch_of(w.task),
                    update=new,
                    compute=float(d_grad - d_read),
                    transfer=float(d_read - d0),
                    apply=float(d_applied - d_grad),
                    engine=engine,
                    paced=paced,
                    warmup=int(k) < self.per_call,
                )
            )
            if int(k) < self.per_call:
                w.warm_end = end
                self.warmed()
            self.history.add_global(GlobalStep(new, end, float(loss), aggregated=(w.task,)))
            if not self.policy.check_loss(float(loss), new):
                break
            if new >= self.steps:
                self.control.stop()  # the last update: done
        pending.clear()
