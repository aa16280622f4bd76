"""A training run's life: set up, train (sync or async), checkpoint, evaluate, end, resume.

The parts, each in its own module: the settings (:mod:`.config`), where the
variables live (:mod:`.params`), what runs on each worker (:mod:`.steps`),
the two algorithms (:mod:`.sync`, :mod:`.asynchronous`), what failures mean
(:mod:`.failures`), checkpoints (:mod:`.checkpoints`), the held-out probe and
the final evaluation (:mod:`.evaluation`) and each worker's notes in its log
(:mod:`.notes`).  This module only puts them together and keeps the thread
that runs them.
"""

from __future__ import annotations

import threading
import time
import weakref

import numpy as np

from .. import client, events
from ..errors import TrainingError, WaitTimedOut
from ..metrics import History
from ..spec import TaskName
from . import evaluation, schedule
from .checkpoints import Checkpoints
from .config import RunConfig
from .control import Control
from .failures import FailurePolicy
from .models import Model, resolve
from .notes import WorkerNotes
from .optimizers import Optimizer
from .params import ParameterStore, clear_executor
from .schedule import Schedule
from .steps import Worker, join_worker_threads, own_executor, place_worker

#: how long ``stop()`` waits for the run's calls before it leaves them behind
STOP_WAIT = 1.5

#: the runs started and not yet ended, to refuse a second one on the same tasks (see refuse_if_training)
_TRAINING: weakref.WeakSet = weakref.WeakSet()
_TRAINING_LOCK = threading.Lock()


class _EngineRetracing:
    """Keeps TensorFlow's "N out of the last N calls to <function> triggered tf.function retracing"
    out of the notebook when the engine's own threads trigger it.

    Each run traces its step, apply and ring functions anew (they close over that run's variables),
    so after a few short runs TensorFlow warns about retracing, as if the user's code were at fault.
    The engine's threads are named ``tfmagic-...``; their warnings go to the kernel's log
    (``%tf_cluster logs kernel``). A user's own function retracing still warns as usual.
    """

    def filter(self, record) -> bool:
        if not record.threadName.startswith("tfmagic-"):
            return True
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a record that cannot format is not ours to judge
            return True
        if "triggered tf.function retracing" not in text:
            return True
        try:
            from ..procs import owner

            with open(owner.kernel_log(), "a") as log:
                log.write(f"engine retracing ({record.threadName}): {text.splitlines()[0]}\n")
        except OSError:
            pass
        return False


def quiet_engine_retracing() -> None:
    """Install :class:`_EngineRetracing` on TensorFlow's logger (once)."""
    import logging

    logger = logging.getLogger("tensorflow")
    if not any(isinstance(f, _EngineRetracing) for f in logger.filters):
        logger.addFilter(_EngineRetracing())


def refuse_if_training(cluster, starting=None) -> None:
    """One run at a time per cluster: raise :class:`TrainingError` if another run trains on it.

    Two runs on the same tasks at once deadlock inside TensorFlow (each
    worker's calls of both runs wait on each other: py-spy showed every
    worker thread in ``quick_execute``), so a second start is refused in one
    line instead of hanging.
    """
    with _TRAINING_LOCK:
        _refuse_locked(cluster, starting)


def _refuse_locked(cluster, starting) -> None:
    for other in list(_TRAINING):
        thread = other._thread
        busy = thread is not None and (thread.ident is None or thread.is_alive()) and not other._abandoned
        if other is not starting and other.cluster is cluster and busy:
            done = other.history.steps
            raise TrainingError(
                f"the cluster is already training {other.name!r} ({done}/{other.config.steps} updates): "
                "wait for it (run.wait()) or stop it (run.stop()), then start this one"
            )


def measure_pace(cluster) -> float:
    """``pace="auto"``: measure this machine for ``cluster`` now (see :mod:`.calibrate`); the step time."""
    from .calibrate import calibrate

    def probe(steps: int):
        return (
            TrainingRun(cluster, "async", model="digits", steps=steps, name="pace-calibration").start().wait()
        )

    return calibrate(cluster, probe)


#: what TensorFlow raises when a call's connection broke under it (a relay restarted, a socket closed)
_BROKEN_CONNECTION = ("UnavailableError", "InternalError", "CancelledError", "AbortedError")


def _retrying(policy: FailurePolicy, what: str, fn):
    """``fn()``, started again from the beginning while it fails on a broken connection and the policy
    allows another try (:meth:`FailurePolicy.retry_call`: every task alive, tries left); else raised."""
    for attempt in range(FailurePolicy.CALL_RETRIES + 1):
        try:
            return fn()
        except Exception as exc:  # a broken connection is tried again, the rest raised
            clear_executor()
            if type(exc).__name__ not in _BROKEN_CONNECTION or not policy.retry_call(what, exc, attempt):
                raise


def _died_as_placed(kind: str, w: Worker, proc) -> bool:
    """Whether worker ``w`` died while the run placed it; it is then lost, and the run goes on with the
    others (the loops take it back once restarted), as when it dies a moment later. It failed the whole
    run: bench/worker_kill.py --kill-at random --within 0.3, 5 runs of 25 made 0 of 600 updates. Sync in
    one call per update (``fused``) needs every worker: it still fails."""
    if kind == "fused":
        return False
    proc.wait_for(lambda: not proc.alive, 1.0)  # the owner sees a death a moment after the call
    if proc.alive:
        return False
    clear_executor()
    w.lost = True
    return True


class TrainingRun:
    """One training run on a cluster; :func:`tfmagic.train` makes and starts it.

    ``history`` grows while it runs; ``wait()`` returns it when done;
    ``stop()`` ends it within two seconds, whatever the tasks do;
    ``resume()`` continues a run that stopped (for example after its ps was
    lost and restarted) from its last checkpoint.
    """

    def __init__(
        self,
        cluster,
        mode: str = "sync",
        model="linear",
        initial_weights: list | None = None,
        events: str | list | None = None,
        **kwargs,
    ) -> None:
        if cluster is None or not cluster.running:
            raise TrainingError(
                "the cluster is not running; start it first (cluster.start() or %tf_cluster start)"
            )
        self.cluster = cluster
        self.workers_n = cluster.shape.workers
        self.config = RunConfig.checked(self.workers_n, mode=mode, **kwargs)
        if self.config.late == "cancel" and cluster.pace is None:
            raise TrainingError(
                "late='cancel' needs a paced cluster: a real step cannot be stopped once its worker runs "
                "it, a modelled machine can (start the cluster with pace=..., or use late='finish')"
            )
        try:
            self.model: Model = resolve(model)
        except (ValueError, TypeError) as exc:
            raise TrainingError(str(exc)) from None
        self.name = self.config.name
        self.who = f"training run {self.name} ({id(self):x})"
        self.initial_weights = initial_weights
        self.history = History(
            self.mode, run=self.name, workers=[TaskName("worker", i) for i in range(self.workers_n)]
        )
        self.history.final_loss_label = self.model.eval_label
        c = self.config
        self.history.config = {
            "mode": c.mode,
            "model": self.model.name,
            "steps": c.steps,
            "lr": c.lr,
            "batch_size": c.batch_label,
            "backup_workers": c.backup_workers,
            "optimizer": c.optimizer,
            "workers": self.workers_n,
            "ps": cluster.shape.ps,
        }
        if c.late != "finish":
            self.history.config["late"] = c.late
        self.control = Control()
        self.params = ParameterStore(cluster, Optimizer(c.optimizer, c.lr), self.who)
        self.params.names = self.model.weight_names()
        self.checkpoints = Checkpoints(c.checkpoint_dir, self.name, c.checkpoint_every)
        self.policy = FailurePolicy(self, self.control, self.history, self.params)
        self.error: TrainingError | None = None
        self.dashboard = None
        self.final_weights: list | None = None
        self.final_state: list | None = None
        self._thread: threading.Thread | None = None
        self._start_step = 0
        self._slots: list | None = None
        self._writer = None
        #: each worker's share of the run, written into its log (see :mod:`.notes`)
        self.notes = WorkerNotes(self)
        #: (update, weights) of the latest held-out probe (the TensorBoard writer's histograms)
        self.probed: tuple | None = None
        self.kind = ""
        self.scheduled = Schedule(self)
        if events:
            self.scheduled.add(
                schedule.parse(events, cluster)
                if isinstance(events, str)
                else [schedule.make(*e, cluster=cluster) if isinstance(e, tuple) else e for e in events]
            )

    # -- what it was asked -----------------------------------------------------
    @property
    def mode(self) -> str:
        return self.config.mode

    @property
    def steps(self) -> int:
        return self.config.steps

    @property
    def variables(self) -> list:
        """The model's variables, on the ps tasks."""
        return self.params.variables

    # -- control -------------------------------------------------------------
    def schedule(
        self, step: int, *, slow: tuple | None = None, kill: str | None = None, restart: str | None = None
    ) -> TrainingRun:
        """Slow, kill or restart a task when the run reaches update ``step`` (see :mod:`.schedule`).

        >>> run.schedule(step=500, slow=("worker:1", 4))   # doctest: +SKIP
        >>> run.schedule(step=900, kill="worker:2")         # doctest: +SKIP
        """
        given = [(v, a) for v, a in (("slow", slow), ("kill", kill), ("restart", restart)) if a is not None]
        if len(given) != 1:
            raise TrainingError(
                "schedule one event at a time: slow=(task, factor), kill=task or restart=task"
            )
        verb, arg = given[0]
        task, extra = (arg[0], arg[1]) if verb == "slow" and isinstance(arg, tuple) else (arg, None)
        if verb == "slow" and extra is None:
            raise TrainingError("slow takes (task, factor), e.g. slow=('worker:1', 4)")
        self.scheduled.add([schedule.make(step, verb, task, extra, self.cluster)])
        return self

    def start(self) -> TrainingRun:
        pace = self.cluster.pace
        if pace is not None and not pace.calibrated:  # pace="auto": measured once, before the first run
            refuse_if_training(self.cluster, self)
            measure_pace(self.cluster)
        with _TRAINING_LOCK:  # refused and claimed at once, in the caller: two starts cannot both pass
            _refuse_locked(self.cluster, self)
            self._thread = threading.Thread(target=self._main, name=f"tfmagic-train-{self.name}", daemon=True)
            _TRAINING.add(self)
        self.scheduled.add([])  # follows the history again if events are still to come (a resume)
        self._thread.start()
        events.started.publish(self)
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._abandoned

    _abandoned = False

    def wait(self, timeout: float | None = None, raise_error: bool = True) -> History:
        """Block until training ends; raises :class:`TrainingError` if it failed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.running:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise WaitTimedOut(f"training {self.name} still running after {timeout:g} s")
            self._thread.join(0.1 if remaining is None else min(remaining, 0.1))
        if self.error is not None and raise_error:
            raise self.error
        return self.history

    def stop(self, wait: bool = True) -> History:
        """End training now; returns within two seconds whatever the tasks do.

        The steps under way finish (or, when a task does not answer, are left
        behind: the run then says which and ends anyway).
        """
        self.control.stop()
        if not wait or self._thread is None:
            return self.history
        self._thread.join(STOP_WAIT)
        if self._thread.is_alive():
            waiting = [w for w, _s in client.gate.in_flight() if w == self.who]
            client.gate.drop(self.who)
            self._abandoned = True
            stuck = self._unresponsive()
            note = (
                f"stopped; {len(waiting) or 'its'} remote call(s) did not return within {STOP_WAIT:g} s"
                + (f" ({', '.join(stuck)} does not answer: stopped or hung)" if stuck else "")
                + " and were left behind"
            )
            self.control.reason = note
            self.history.add_event("stopped", detail=note)
            self.history.ended_at = time.time()
        return self.history

    def _unresponsive(self) -> list[str]:
        """The live tasks that cannot answer now (stopped by someone else, or hung): the cluster's own word."""
        cluster = self.cluster
        return [
            task
            for task, proc in list(cluster.procs.items())
            if proc.alive and cluster.condition(task).startswith(("stopped", "not answering"))
        ]

    def resume(self, block: bool = True) -> TrainingRun:
        """Continue from the last checkpoint, e.g. after a lost ps was restarted.

        Updates made after that checkpoint are lost with the ps; the history
        marks them as rolled back and counts every step once.
        """
        if self.running:
            raise TrainingError(f"training {self.name} is still running; stop() it first")
        if self.checkpoints.last() is None:
            raise TrainingError(f"training {self.name} has no checkpoint yet; start a new run instead")
        self.initial_weights, self._slots, self._start_step = self.checkpoints.load()
        self.error = None
        self._abandoned = False
        self.control.reset()
        self.history.error = None
        self.history.ended_at = None
        undone = self.history.rollback(self._start_step)
        if undone:
            self.history.add_event(
                "rollback",
                detail=f"{undone} updates after step {self._start_step} were lost with the ps",
                step=self._start_step,
            )
        self.history.add_event(
            "resume", detail=f"from checkpoint at step {self._start_step}", step=self._start_step
        )
        self.start()
        if block:
            self.wait()
        return self

    def last_checkpoint(self):
        return self.checkpoints.last()

    def __repr__(self) -> str:
        if self.running:
            state = "training"
        elif self.error is not None:
            state = f"stopped: {self.error}"
        elif self.control.reason:
            state = self.control.reason
        else:
            state = "done" if self._thread is not None else "not started"
        lost = f" (+{self.history.unrecorded} applied without a record)" if self.history.unrecorded else ""
        return f"<TrainingRun {self.name} ({self.mode}): {state}, {self.history.steps}/{self.steps} updates{lost}>"

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(repr(self) + "\n" + self.history.summary())

    # -- main ----------------------------------------------------------------
    def _main(self) -> None:
        with own_executor():
            self._main_body()

    def _main_body(self) -> None:
        from .asynchronous import AsyncLoop
        from .sync import FusedSyncLoop, SyncLoop

        following = self.cluster.events.subscribe(self.policy.on_cluster_event)
        try:
            self._setup()
            self.history.started_at = time.time()
            probe = threading.Thread(
                target=evaluation.probe, args=(self,), name=f"tfmagic-probe-{self.name}", daemon=True
            )
            probe.start()
            self.policy.begin_loop()  # from here a ps holding the run's variables leaves at a pause
            try:
                if self.kind == "fused":
                    FusedSyncLoop(self).run(self._start_step, self.steps)
                elif self.kind == "sync":
                    SyncLoop(self).run(self._start_step, self.steps)
                else:
                    AsyncLoop(self).run()
            finally:
                self.policy.end_loop()  # nothing steps now: a ps still to leave is moved off
            self._check_pace()
            if self.control.fatal is not None:
                raise self.control.fatal
            if self.control.reason:  # the cluster went away under the run
                raise TrainingError(f"training {self.control.reason}")
            self.checkpoint(force=True)
            evaluation.evaluate(self)
            self.notes.note(
                f"ended at update {self.step_now()}, final held-out loss {self.history.final_loss:.4f}"
            )
        except TrainingError as exc:
            self._end(exc)
        except Exception as exc:  # noqa: BLE001 - turned into a TrainingError with evidence
            self._end(
                self.control.fatal
                or (
                    TrainingError(f"training {self.control.reason}")
                    if self.control.reason
                    else self.policy.explain(exc)
                )
            )
        finally:
            self.control.stop()
            waiting = join_worker_threads(self.policy.workers.values(), self.control)
            if waiting and client.gate.drop(self.who):  # as stop() does: no later connection inherits them
                self.history.add_event(
                    "stopped", detail=f"the calls of {', '.join(waiting)} were left behind"
                )
            self.policy.release_all()  # a task being removed need not wait for a run that ended
            following.close()
            self.scheduled.close()
            if not self._abandoned:
                if self.error is not None:
                    self.history.error = str(self.error)
                    self.history.add_event("error", detail=str(self.error))
                self.history.ended_at = time.time()
            if self._writer is not None:
                self._writer.close()

    def _end(self, error: TrainingError) -> None:
        if not self._abandoned:
            self.error = error

    # -- the parts -------------------------------------------------------------
    @property
    def start_step(self) -> int:
        """The global step this run started from (a resumed run: its checkpoint's)."""
        return self._start_step

    def step_now(self) -> int:
        """The latest global step this run knows of."""
        last = self.history.global_steps[-1].step if self.history.global_steps else 0
        return max(last, self._start_step)

    def _choose_kind(self) -> str:
        """How the engine runs this run's steps (see :func:`~tfmagic.training.steps.place_worker`).

        Sync with every worker taking part and no pace is one call per update
        (``fused``); with backup workers, a pace, or a worker missing it is a
        thread per worker (``sync``).  Async on a paced cluster applies each
        gradient at its modelled step's end (``paced``).
        """
        if self.mode == "sync":
            plain = self.config.backup_workers == 0 and self.cluster.pace is None
            return "fused" if plain and all(p.alive for p in self.cluster.procs.values()) else "sync"
        return "paced" if self.cluster.pace is not None else "async"

    def _check_pace(self) -> None:
        """Say so when the machine could not keep the modelled pace (its steps then teach the laptop)."""
        from ..pace import pace_notes

        if self.cluster.pace is None:
            return
        recs = [r for r in self.history.records if not r.warmup]
        for note in pace_notes(self.cluster.pace, recs, instant_updates=self.kind == "paced"):
            self.history.notes.append(note)
            self.history.add_event("pace", detail=note)

    def _setup(self) -> None:
        quiet_engine_retracing()
        self.cluster.connect()
        now = len(self.cluster.tasks("worker"))
        if now < self.workers_n:
            # workers removed between train() and here (a removal ends the highest-numbered first, and waits
            # only for runs already stepping): the run starts with the workers there are, as if started now
            if now == 0:
                raise TrainingError(
                    "the cluster has no worker left; add one (cluster.add('worker')) and train again"
                )
            self.workers_n = now
        self.kind = self._choose_kind()
        self.history.config["engine"] = self.kind
        if self.mode == "sync" and self.kind != "fused" and self.config.steps_per_call > 1:
            raise TrainingError(
                "steps_per_call for sync needs every worker running and an unpaced cluster (one call makes "
                "whole updates); use steps_per_call=1 here"
            )
        away = set(client.omitted())  # tasks that did not answer: dead, or stopped from outside
        procs = self.cluster.procs
        for t in self.params.ps_tasks:
            # left out of the connection, or dead since (a call placed on it would wait for ever)
            if t in away or (t in procs and not procs[t].alive):
                raise TrainingError(
                    f"{t} does not answer ({self.cluster.condition(t)}): the variables cannot live there. "
                    f"Restart it (cluster.restart('{t}'"
                    + (", force=True" if t in procs and procs[t].alive else "")
                    + ")) and train again"
                )
        # every task lives, yet a call may fail: its connection broke (the relay restarted as the run set up)
        # unary calls (no streaming enqueue): a worker that died just before its placement held the run's
        # setup for ever on its stream (a variable's shape waited for a reply that never came)
        with own_executor(for_async=True):
            left = _retrying(self.policy, "setting up the run", lambda: self._place_everything(away))
        for task in left:  # once, from the attempt that placed everything
            self.history.add_event("left", task, "removed as the run started", step=self._start_step)
        if self.config.logdir is not None and self._writer is None:
            from ..tensorboard import Writer

            self._writer = Writer(self.config.logdir / self.name, self.history, run=self)
        self.history.add_event(
            "start", detail=f"{self.mode}, {self.workers_n} workers", step=self._start_step
        )

    def _place_everything(self, away: set) -> list[TaskName]:
        """The run's variables on the ps, and each worker's input, state and step functions; returns
        the workers removed (or being removed) as the run starts, which are not its workers."""
        from ..cluster import membership

        init = self.initial_weights or self.model.initial_weights(self.config.seed)
        self.params.place(init, self._start_step, self._slots)
        self.history.layout = self.layout()
        if self.kind == "sync":
            self.params.make_buffers(self.workers_n)
        self.policy.workers = {}
        left = []
        for i in range(self.workers_n):
            w = Worker(TaskName("worker", i), i)
            self.policy.workers[w.task] = w
            proc = self.cluster.procs.get(w.task)
            if proc is None or membership.departure(self.cluster.id, w.task) is not None:
                # removed, or being removed, as the run starts: not one of its workers
                w.retired = w.lost = True
                left.append(w.task)
            elif proc.alive and w.task not in away:
                try:
                    self.place(w)
                except Exception:
                    if not _died_as_placed(self.kind, w, proc):
                        raise
            else:
                w.lost = True
        return left

    def layout(self) -> list[tuple]:
        """(name, task, shape, dtype, bytes) of every variable of the run, where it lives now."""
        return [
            (
                v.name.split(":")[0],
                str(TaskName.parse(v.device)),
                tuple(v.shape.as_list()),
                v.dtype.name,
                int(v.dtype.size) * int(v.shape.num_elements() or 0),
            )
            for v in [*self.params.variables, self.params.global_step]
        ]

    def place(self, w: Worker) -> None:
        place_worker(
            w,
            kind=self.kind,
            per_call=self.config.steps_per_call,
            model=self.model,
            params=self.params,
            batch=self.config.batch_of(w.task),
            workers=self.workers_n,
            limit=self.steps,
            who=self.who,
        )

    def checkpoint(self, force: bool = False) -> None:
        if self.checkpoints.maybe_save(
            self.params, self.step_now(), self._start_step, self.steps, force=force
        ):
            self.history.checkpoint = str(self.checkpoints.path)

    def weights(self) -> list[np.ndarray]:
        """The current weights, read from the ps tasks."""
        return self.params.weights()
