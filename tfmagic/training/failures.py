"""What a run does when something goes wrong: the failure policy, as a class would teach it.

* a worker is lost: async goes on without it; sync with backup workers goes
  on while enough remain; sync without backups stops at once and says what
  to do; a restarted worker rejoins;
* a ps is lost: its variables are gone; the run stops within a second and
  ``resume()`` continues from the last checkpoint once the ps is restarted;
* a ps is removed (``cluster.remove("ps:1")``): an async or plain sync run
  pauses at a step boundary and moves its variables off it first (see
  :meth:`FailurePolicy.respread`); a run that is not training moves them at
  once; the others make the removal refuse, saying why (see
  :func:`tfmagic.elastic.remove`);
* the cluster stops (or is replaced): the run ends at once, saying so;
* the loss becomes NaN or infinite: the run stops at that update and says
  what to try.
"""

from __future__ import annotations

import math
import threading
import time
from typing import TYPE_CHECKING

from .. import client, doctor
from ..cluster import membership as elastic
from ..errors import TrainingError
from ..events import Event
from ..metrics import History
from ..spec import TaskName
from .control import Control
from .params import ParameterStore, clear_executor
from .steps import Worker

if TYPE_CHECKING:
    from .context import PolicyContext


class FailurePolicy:
    """Decides, for one run, what each failure means and what happens next."""

    def __init__(
        self, run: PolicyContext, control: Control, history: History, params: ParameterStore
    ) -> None:
        self.run = run
        self.cluster = run.cluster
        self.config = run.config
        self.control = control
        self.history = history
        self.params = params
        self.workers: dict[TaskName, Worker] = {}
        #: a ps joined or is leaving: the run's loop re-spreads the variables at a pause (async, plain sync)
        #: or notes why not
        self.respread_pending = False
        #: ps being removed whose departure this run holds until its loop moved the variables off them
        self.ps_leaving: list[TaskName] = []
        #: ps this run moved its variables off, and what it recorded (its "left" event, with the figures)
        self.moved_off: dict[TaskName, str] = {}
        self._moving = threading.RLock()  # a loop starting or ending vs. a ps leaving
        self._looping = False
        #: why the last move off a leaving ps did not happen (the removal says it); None once one did
        self.move_error: str | None = None
        #: what the cluster said when its network relay last ended during this run (calls through it broke)
        self.relay_ended: str | None = None
        elastic.track(self.cluster.id, self)

    # -- what the cluster says ------------------------------------------------
    def on_cluster_event(self, event: Event) -> None:
        if event.kind == "stopping":
            # The cluster's tasks are about to be killed: end now, and leave nothing waiting on them.
            self.control.stop(f"stopped: {event.detail}")
            client.gate.drop(self.run.who)
            return
        if event.kind == "relay":  # the modelled network's relay ended (and restarted, or not)
            self.relay_ended = event.detail
            self.history.add_event(event, step=self.run.step_now())
            return
        task = event.task
        if task is None:
            return
        if task.job == "ps" and event.kind == "left":
            if task not in self.moved_off:  # else recorded when the variables moved, with the figures
                self.history.add_event(event, step=self.run.step_now())
        elif not (event.kind in ("joined", "left") and self.run.mode == "sync"):
            # sync records membership at the step boundary where the replica count changes
            self.history.add_event(event, step=self.run.step_now())
        if task.job == "worker" and event.kind == "joined":
            self.join(task)
        elif task.job == "ps" and event.kind == "joined":
            self.respread_pending = True  # the loop moves variables at its next pause (see respread)
        elif task.job == "ps" and event.kind == "leaving":
            self.ps_leave(task)
        elif task.job == "worker" and event.kind == "leaving" and task in self.workers:
            self.leave(task)
        elif task.job == "worker" and task in self.workers:
            w = self.workers[task]
            if event.kind in ("kill", "lost"):
                w.lost = True
            elif event.kind == "restart":
                w.lost = False
                w.rebuild = True
        elif task.job == "ps" and event.kind in ("kill", "lost"):
            self.control.fail(self.ps_lost(task))
        self.control.wake()

    # -- membership (see tfmagic.elastic) -------------------------------------------
    def join(self, task: TaskName) -> None:
        """A worker joined the cluster: the run's loop places it and gives it steps.

        The workers' dict is replaced, never changed in place: the loops'
        threads iterate over it without a lock.
        """
        old = self.workers.get(task)
        if self.control.stopping or (old is not None and not old.retired):
            return
        w = Worker(task, task.index, rebuild=True, joined=False)
        # SSP counts steps from the slowest worker: a newcomer starts level with it, not 500 behind
        w.local_step = w.landed = min((x.landed for x in self.members() if not x.lost), default=0)
        self.run.workers_n = max(self.run.workers_n, task.index + 1)
        if task not in self.history.workers:
            self.history.workers.append(task)
        self.workers = {**self.workers, task: w}

    def leave(self, task: TaskName) -> None:
        """A worker is leaving: it gets no new step; the run says when its last call returned."""
        from ..cluster import membership as elastic

        dep = elastic.departure(self.cluster.id, task)
        w = self.workers[task]
        if dep is None or w.retired or self.control.stopping:
            return
        w.drain = dep.drain
        w.leaving = True
        dep.hold(self.run.who)
        if w.thread is None and self.run.kind != "fused":  # never given a step: nothing to wait for
            self.retire(w)

    def retire(self, w: Worker) -> None:
        """``w`` has made its last call for this run; its task may go."""
        from ..cluster import membership as elastic

        w.retired = True
        w.lost = True  # out of every count of running workers
        dep = elastic.departure(self.cluster.id, w.task)
        if dep is not None:
            dep.release(self.run.who)
        self.control.wake()

    def release_all(self) -> None:
        """The run ended: every task it was asked to let go of is let go of."""
        for w in list(self.workers.values()):
            if (w.leaving or w.thread is None) and not w.retired:
                self.retire(w)

    def members(self) -> list[Worker]:
        """The workers taking part now (sync: the replicas), lost ones included."""
        return [w for w in self.workers.values() if w.joined and not w.retired and not w.dropping]

    # -- a ps removed (see tfmagic.elastic.remove) ------------------------------------
    def cannot_move(self) -> str | None:
        """Why this run's loop cannot move its variables while it trains (None: it can)."""
        if self.run.kind == "paced":
            return "a paced async run holds gradients in flight between its calls"
        if self.run.kind == "sync":
            return (
                "the per-worker sync loop (backup workers, a pace, or a worker missing at its start) keeps "
                "a gradient buffer per worker beside each variable"
            )
        return None

    def ps_report(self, task: TaskName) -> tuple[str, list[str], str | None]:
        """For :func:`tfmagic.elastic.remove`: (this run's name, what it keeps on ``task``, why it
        cannot move that now, None if it can)."""
        with self._moving:
            held = self.params.held_on(task)
            return self.run.name, held, self.cannot_move() if held and self._looping else None

    def ps_leave(self, task: TaskName) -> None:
        """A ps is leaving: a training loop that keeps variables there moves them at its next pause.

        The run holds the departure until then, so the ps process ends only
        once nothing of the run is left on it.  A run whose loop is not
        running is moved by :meth:`move_off_now` instead.
        """
        dep = elastic.departure(self.cluster.id, task)
        proc = self.cluster.procs.get(task)
        with self._moving:
            if dep is None or not self._looping or self.cannot_move() is not None:
                return
            if proc is None or not proc.alive:  # gone with its variables: the run fails as for a lost ps
                return
            if not self.params.held_on(task):
                return
            self.move_error = None
            dep.hold(self.run.who)
            self.ps_leaving.append(task)
            self.respread_pending = True  # the loop moves them at its next pause (see respread)
        self.control.wake()

    def move_off_now(self, task: TaskName) -> None:
        """Called by :func:`tfmagic.elastic.remove` for every run: one whose loop is not running (it
        ended, or has not begun) and keeps variables on ``task`` moves them now; a training one
        moves them at its next pause (or cannot, and the removal says so)."""
        with self._moving:
            self.moved_off.pop(task, None)  # from an earlier removal of a ps of that name
            if self._looping or not self.params.held_on(task):
                return
            self.move_error = None
            try:
                self.params.drop_buffers_on(task)  # an ended per-worker sync run's: a new start makes them
                self.respread(self.run.step_now(), replace_workers=True, leaving=[task])
            except Exception as exc:  # noqa: BLE001 - the removal sees what is left there and says why
                clear_executor()
                self.move_error = f"moving them failed: {type(exc).__name__}: {_said(exc, 200)}"

    def begin_loop(self) -> None:
        """The run's loop starts stepping: from now a leaving ps is moved off at one of its pauses."""
        with self._moving:
            self._looping = True

    def end_loop(self) -> None:
        """The run's loop ended: no step runs any more, so a ps it was asked to leave is moved off now."""
        with self._moving:
            self._looping = False
            if self.ps_leaving:
                try:
                    self.respread(self.run.step_now(), replace_workers=False)
                except Exception as exc:  # noqa: BLE001 - the removal sees what is left there and says why
                    clear_executor()
                    self.move_error = f"moving them failed: {type(exc).__name__}: {_said(exc, 200)}"
                    self._release_leaving()

    def _take_leaving(self) -> list[TaskName]:
        with self._moving:
            leaving, self.ps_leaving = self.ps_leaving, []
            return leaving

    def _release_leaving(self, leaving: list[TaskName] | None = None) -> None:
        if leaving is None:
            leaving = self._take_leaving()
        for task in leaving:
            dep = elastic.departure(self.cluster.id, task)
            if dep is not None:
                dep.release(self.run.who)

    def respread(
        self,
        t: int,
        replace_workers: bool = True,
        paused_at: float | None = None,
        leaving: list[TaskName] | None = None,
    ) -> None:
        """Move the variables over the ps set now (every step paused by the caller); recorded as an event.

        The ps set is the cluster's, less a ps being removed
        (:attr:`~.params.ParameterStore.ps_tasks`): after an add this moves
        variables onto the new ps (a ``respread`` event), during a removal
        off the leaving one (a ``left`` event for that ps, with the bytes
        moved and how long the steps were held since ``paused_at``), and the
        departure is released so the ps process can end.  The workers' step
        functions captured the old variables: each worker is placed again
        (quietly) before its next step.
        """
        self.respread_pending = False
        if leaving is None:
            leaving = self._take_leaving()
        try:
            going = [task for task in leaving if elastic.departure(self.cluster.id, task) is not None]
            t0 = time.time()
            size, moved = self.params.respread()
            took = time.time() - t0
            for w in self.workers.values():
                if replace_workers and not w.retired:
                    w.joined, w.rebuild = False, True  # placed again, without a "rejoin" event
            self.history.layout = self.run.layout()
        except BaseException:
            self._release_leaving(leaving)
            raise
        what = f"{len(moved)} variable(s) moved ({', '.join(moved) or 'none'})"
        if not going:
            self.history.add_event(
                "respread",
                None,
                f"{what}: {size} bytes in {took:.2f} s; the workers' steps are then built again",
                step=t,
            )
        held = "" if paused_at is None else f"; steps held {time.time() - paused_at:.2f} s"
        after = "the step functions are then built again" if self._looping else "the run was not stepping"
        for task in going:
            detail = f"{_kb(size)} moved in {took:.2f} s ({what}, {size} bytes){held}; {after}"
            self.moved_off[task] = detail
            self.history.add_event("left", task, detail, step=t)
        self._release_leaving(leaving)

    def no_respread(self, why: str) -> None:
        if self.respread_pending:
            self.respread_pending = False
            self.history.add_event(
                "respread", None, f"a ps joined; this run keeps its variables where they are ({why})"
            )
        if self.ps_leaving:  # the pause did not happen: the removal says why, and the ps stays
            self.move_error = why
            self._release_leaving()

    def ended_outside(self, tasks) -> TrainingError | None:
        """The error to end with when a scheduler ended ``tasks`` (Slurm's ``scancel``, a time limit):
        no restart brings a cancelled job back, so the advice is a new start; ``None`` otherwise."""
        for task in tasks:
            proc = self.cluster.procs.get(task)
            cause = self.cluster.launcher.ended_by(proc) if proc is not None else ""
            if cause:
                return TrainingError(
                    f"{task} was lost at step {self.run.step_now()}: {cause}, and its tasks with it; start "
                    "the cluster again (%tf_cluster start ... --replace) and train from the start"
                )
        return None

    def all_lost_error(self) -> TrainingError:
        """Every worker is gone: why, and what to do."""
        return self.ended_outside([w.task for w in self.workers.values()]) or TrainingError(
            "every worker was lost; restart them (%tf_cluster restart worker:0 ...) and resume()"
        )

    def ps_lost(self, task: TaskName) -> TrainingError:
        outside = self.ended_outside([task])
        if outside is not None:
            return outside
        ckpt = self.run.checkpoints.last()
        at = f"step {self.run.checkpoints.last_step}" if ckpt else "no checkpoint yet"
        return TrainingError(
            f"{task} was lost at step {self.run.step_now()}: the variables on it are gone. "
            f"Restart it (cluster.restart('{task}') or %tf_cluster restart {task}) and call resume() "
            f"to continue from the last checkpoint ({at})."
        )

    def explain(self, exc: Exception, what: str = "training stopped") -> TrainingError:
        """An unexpected error, as the user should read it."""
        lost = [t for t, p in self.cluster.procs.items() if not p.alive]
        if lost:
            return TrainingError(
                f"{what}: {', '.join(lost)} is gone ({type(exc).__name__}); restart it and resume()"
            )
        said = doctor.translate(str(exc))
        relay = f"; {self.relay_ended}" if self.relay_ended else ""
        return TrainingError(
            f"{what}: {type(exc).__name__}: {_said(exc)}" + (f" ({said})" if said else "") + relay
        )

    #: a call that failed while every task lived (its connection broke: the network relay restarted, a
    #: socket closed) goes out again this many times before the run stops and says why
    CALL_RETRIES = 5

    def retry_call(self, what: str, exc: Exception, attempt: int, reached: int = 0) -> bool:
        """Whether ``what``, which failed with ``exc``, should go out again (recorded as a retry event).

        Only while every task of the cluster lives (a dead one is the failure policy's, elsewhere) and
        tries remain; each waits a little longer, so a relay that restarts has time to listen again.
        ``reached``: updates of the call the ps holds though its reply was lost (counted as applied
        without a record, and said).
        """
        if attempt >= self.CALL_RETRIES or self.control.stopping:
            return False
        if any(not p.alive for p in self.cluster.procs.values()):
            return False
        time.sleep(0.2 * 2**attempt)  # first: by then the relay's end (if that was it) has been told
        cause = doctor.translate(str(exc)) or _said(exc, 160)
        relay = " after the network relay restarted" if self.relay_ended else ""
        lost = ""
        if reached:
            self.history.unrecorded += reached
            lost = f"; {reached} of its updates reached the ps, their reply did not"
            self.history.notes.append(
                f"{reached} update{'s' if reached > 1 else ''} the ps applied {'have' if reached > 1 else 'has'} "
                f"no record: {what}'s reply was lost{relay}"
            )
        self.history.add_event(
            "retry",
            None,
            f"{what} failed{relay} ({type(exc).__name__}: {cause}){lost}; "
            + ("the rest sent again" if reached else "sent again"),
            step=self.run.step_now(),
        )
        return True

    # -- what a step says ---------------------------------------------------------
    def check_loss(self, loss: float, update: int) -> bool:
        """False (and the run stops, saying why) when the loss is no longer a number."""
        if math.isfinite(loss):
            return True
        self.control.fail(
            TrainingError(
                f"the loss became {loss} at update {update}: training diverged (lr={self.config.lr:g} is too "
                f"large for this model, or its inputs are not scaled); try a smaller lr, e.g. "
                f"lr={self.config.lr / 10:g}, or the adagrad optimizer"
            )
        )
        return False

    def handle_error(self, w: Worker, exc: Exception) -> None:
        """A worker's call failed: a lost worker, a lost ps, its input ran out, or a passing error."""
        clear_executor()
        if self.control.stopping:
            return
        procs = self.cluster.procs
        dead = self.params.dead_ps()
        if dead is not None:
            self.control.fail(self.ps_lost(dead))
            return
        if type(exc).__name__ == "OutOfRangeError" and self.run.model.input_dataset(
            w.index, self.run.workers_n
        ):
            self.control.fail(
                TrainingError(
                    f"{w.task} has no training examples: input_fn({w.index}, {self.run.workers_n}) returned an "
                    "empty Dataset; give every shard some examples (or train on fewer workers)"
                )
            )
            return
        proc = procs.get(w.task)
        if proc is None:
            return
        if proc.alive and type(exc).__name__ in ("UnavailableError", "CancelledError"):
            # The task may be dying right now; give the owner a moment to see it.
            proc.wait_for(lambda: not proc.alive, 1.0)
        if not proc.alive:
            if not w.lost:
                w.lost = True
                if not self.cluster.taskset.was_ended_on_purpose(proc):
                    # (a kill's own event is recorded as the cluster emits it, just after the signal:
                    # a "lost" here first told the story backwards)
                    self.history.add_event("lost", w.task, f"{type(exc).__name__}", step=self.run.step_now())
            return
        w.errors += 1
        self.history.add_event(
            "retry",
            w.task,
            f"{type(exc).__name__}: {doctor.translate(str(exc)) or _said(exc, 200)}",
            step=self.run.step_now(),
        )
        if "context_id" in str(exc) or "invalid device" in str(exc):
            w.rebuild = True  # the connection was renewed under us
        if w.errors > 20:  # about 10 s of waiting (below): a relay restarting takes one or two
            said = (
                f"{w.task} keeps failing: {type(exc).__name__}: {_said(exc)}{_relay_hint(self.cluster, exc)}"
            )
            self.control.fail(TrainingError(said))
        time.sleep(min(1.0, 0.05 * w.errors))  # errors in a row wait longer: a connection coming back

    def wait_rejoin(self, w: Worker) -> bool:
        """Wait while ``w`` is lost; True once it can step again."""
        with self.control.cond:
            while w.lost and not self.control.stopping and not w.leaving:
                self.control.cond.wait(0.2)
        if self.control.stopping or w.leaving:
            return False
        if w.rebuild:
            try:
                self.run.place(w)
                if w.joined:
                    self.history.add_event("rejoin", w.task, step=self.run.step_now())
                w.joined = True
            except Exception as exc:  # noqa: BLE001
                self.handle_error(w, exc)
                return False
        return True

    def check_enough_workers(self, t: int, needed: int) -> None:
        """Sync: raise when fewer than ``needed`` workers are left to aggregate step ``t``."""
        alive = [w for w in self.members() if not w.lost]
        if len(alive) >= needed:
            return
        lost = [w.task for w in self.members() if w.lost]
        outside = self.ended_outside(lost)
        if outside is not None:
            raise outside
        if self.config.backup_workers == 0:
            raise TrainingError(_needs_all(self.run.workers_n, lost, t))
        raise TrainingError(
            f"sync training aggregates {needed} gradients per step but only {len(alive)} workers are left "
            f"({', '.join(lost)} lost at step {t}); restart one and resume()."
        )

    def all_lost(self) -> bool:
        return all(w.lost for w in self.workers.values())


def _relay_hint(cluster, exc: Exception) -> str:
    """What a worker's calls that keep failing unavailable may owe to a relay started again earlier.

    Issue 22's fault 4 was such a case: in about 1 run of 25 started just after the relay was killed,
    every call failed "Socket closed" at once for the whole run, because a variable made as the relay
    restarted had a poisoned handle in this process (TensorFlow's "SetRemoteShape status: UNAVAILABLE");
    the run's setup now checks every handle and starts again (``ParameterStore.check_handles``).  The
    hint stays for what else a restart may leave; it says what may be, not what was.
    """
    shaper = getattr(cluster, "shaper", None)
    since = getattr(shaper, "restarted_at", None)
    if since is None or type(exc).__name__ != "UnavailableError":
        return ""
    return (
        f"; the network relay was started again {time.monotonic() - since:.0f} s ago (pid {shaper.pid}): "
        "if every task lives, train again (a new run makes its variables anew)"
    )


def _said(exc: Exception, limit: int = 300) -> str:
    """The line of a TensorFlow error that says what happened: a function's error starts with
    "in user code:" and the traceback of its Python source, and ends with the error itself."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if lines and lines[0].startswith("in user code"):
        lines = [ln for ln in lines if "Error" in ln or "error" in ln][-1:] or lines[-1:]
    return lines[0][:limit] if lines else ""


def _kb(n: int) -> str:
    """Bytes as the events say them: ``9.5 kB``, ``1.2 MB``."""
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("kB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _needs_all(workers: int, lost: list, t: int) -> str:
    """Sync without backup workers lost some: which, and what to do (one or several)."""
    many = len(lost) > 1
    return (
        f"sync training needs all {workers} workers every step (backup_workers=0) and "
        f"{', '.join(map(str, lost))} {'were' if many else 'was'} lost at step {t}. Restart "
        f"{'them' if many else 'it'} (%tf_cluster restart {lost[0]}) and "
        "resume(), or train with backup_workers=1 or mode='async'."
    )


__all__ = ["FailurePolicy"]
