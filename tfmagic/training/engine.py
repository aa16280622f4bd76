"""Sync and async parameter-server training, driven by this process (the client).

The variables live on the ps tasks (spread round-robin when there are
several); each worker holds its own shard of the data in its own memory (or
runs its own ``tf.data`` pipeline there) and computes on it; this process
only tells workers when to step and records what happened.  One Python
thread per worker makes one remote call per step.

* **async** (Downpour-style): each worker's step reads the parameters,
  computes a gradient on its next batch and applies it at once, all in one
  call to that worker.  Staleness (updates by others between the read and
  the apply) is returned by the same call.
* **sync** (the semantics of ``SyncReplicasOptimizer(replicas_to_aggregate,
  total_num_replicas)``): every worker computes a gradient from the current
  parameters; the first ``workers - backup_workers`` to arrive are averaged
  and applied as one update on the ps; gradients that arrive later were
  computed from old parameters and are dropped and counted.

Failures are handled as a class should see them: async goes on without a
lost worker; sync with backups goes on while enough workers remain; sync
without backups fails fast with a clear message; a lost ps stops training
within seconds, and :meth:`TrainingRun.resume` continues from the last
checkpoint once the ps is restarted.  A restarted worker rejoins.
"""

from __future__ import annotations

import contextlib
import os
import queue
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import client
from ..errors import TfmagicError
from ..metrics import GlobalStep, History, StepRecord
from ..spec import TaskName
from .models import Model, resolve
from .optimizers import Optimizer

MODES = ("sync", "async")
#: async: how many steps' numbers are fetched from a worker in one round trip,
#: out of a ring buffer of RING rows kept on the worker
FETCH_EVERY = 8
RING = 512
#: async: the step number in the ring of a call that came after the last update (nothing applied)
SKIPPED = 0
#: errors of a task coming or going (retried quietly), not of the step itself
_CONNECTION_ERRORS = ("UnavailableError", "CancelledError", "AbortedError", "DeadlineExceededError")


@contextlib.contextmanager
def _own_executor():
    """A synchronous eager executor for this thread, as ClusterCoordinator uses.

    With TensorFlow's shared (asynchronous) executor, an error from one
    worker surfaces on another thread's next op, and a call can wait behind
    another thread's call to a dead task; one executor per thread keeps each
    worker's calls and errors its own.
    """
    from tensorflow.python.eager import context, executor

    ex = executor.new_executor(enable_async=False)
    try:
        with context.executor_scope(ex):
            yield
    finally:
        _clear_executor(ex)


def _clear_executor(ex=None) -> None:
    """Forget a failed call's error, so the executor can be used (and deleted) quietly."""
    from tensorflow.python.eager import context

    ex = ex or context.context().executor
    try:
        ex.wait()
    except Exception:  # noqa: BLE001 - the error was already handled where it happened
        pass
    try:
        ex.clear_error()
    except Exception:  # noqa: BLE001
        pass


#: Every tf.function the engine made, kept for the life of the process.
#: Dropping one makes TensorFlow remove it from every task; after a task was
#: restarted that removal can fail ("Tried to remove non-existent function")
#: on a stream other calls share, and the error lands on the next call to
#: that task, often another run's.  Kept, a run's functions cost about 2 MB.
_FUNCTIONS: list = []


def _kept(fn):
    _FUNCTIONS.append(fn)
    return fn


def _with_own_executor(fn):
    def run(*args):
        with _own_executor():
            return fn(*args)

    return run


class TrainingError(TfmagicError):
    """Training could not go on; the message says why and what to do."""


@dataclass
class _Worker:
    """What the engine keeps per worker task."""

    task: TaskName
    index: int
    fn: Callable | None = None
    counter: object = None
    lost: bool = False
    rebuild: bool = False
    errors: int = 0
    last_step: int = -1
    local_step: int = 0
    thread: threading.Thread | None = None
    tensors: list = field(default_factory=list)
    ring: object = None
    seen_k: int = -1
    state: list = field(default_factory=list)  # the model's non-trainable values, on this worker


@dataclass
class _Result:
    step: int
    worker: _Worker
    loss: float
    grads: list
    start: float
    end: float


class TrainingRun:
    """One training run on a cluster; :func:`tfmagic.train` makes and starts it.

    ``history`` grows while it runs; ``wait()`` returns it when done;
    ``stop()`` ends it after the current step; ``resume()`` continues a run
    that stopped (for example after its ps was lost and restarted) from its
    last checkpoint.
    """

    def __init__(
        self,
        cluster,
        mode: str = "sync",
        model="linear",
        steps: int = 200,
        lr: float = 0.1,
        batch_size: int = 32,
        backup_workers: int = 0,
        optimizer: str = "sgd",
        seed: int = 0,
        logdir: str | os.PathLike | None = None,
        checkpoint_every: int = 50,
        checkpoint_dir: str | os.PathLike | None = None,
        name: str | None = None,
        initial_weights: list | None = None,
    ) -> None:
        if mode not in MODES:
            raise TrainingError(f"mode must be 'sync' or 'async', not {mode!r}")
        if cluster is None or not cluster.running:
            raise TrainingError(
                "the cluster is not running; start it first (cluster.start() or %tf_cluster start)"
            )
        self.workers_n = cluster.shape.workers
        for label, value, lo in (
            ("steps", steps, 1),
            ("batch_size", batch_size, 1),
            ("backup_workers", backup_workers, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise TrainingError(f"{label} must be a whole number >= {lo}, not {value!r}")
        if backup_workers >= self.workers_n:
            raise TrainingError(
                f"backup_workers={backup_workers} leaves no gradient to aggregate with {self.workers_n} workers; "
                f"use at most {self.workers_n - 1}"
            )
        if backup_workers and mode == "async":
            raise TrainingError("backup_workers only makes sense for mode='sync' (async never waits)")
        if not lr > 0:
            raise TrainingError(f"lr must be > 0, not {lr!r}")
        self.cluster = cluster
        self.mode = mode
        try:
            self.model: Model = resolve(model)
        except (ValueError, TypeError) as exc:
            raise TrainingError(str(exc)) from None
        self.steps = steps
        self.batch_size = batch_size
        self.backup_workers = backup_workers
        self.replicas_to_aggregate = self.workers_n - backup_workers
        try:
            self.optimizer = Optimizer(optimizer, lr)
        except ValueError as exc:
            raise TrainingError(str(exc)) from None
        self.seed = seed
        self.logdir = Path(logdir) if logdir else None
        self.checkpoint_every = max(1, int(checkpoint_every))
        if checkpoint_dir is None:
            from .. import owner

            checkpoint_dir = tempfile.mkdtemp(prefix="checkpoints-", dir=owner.runtime_dir())
        self.checkpoint_dir = Path(checkpoint_dir)
        self.name = name or mode
        self.initial_weights = initial_weights
        self.history = History(mode, run=self.name, workers=[f"worker:{i}" for i in range(self.workers_n)])
        self.history.final_loss_label = self.model.eval_label
        self.history.config = {
            "mode": mode,
            "model": self.model.name,
            "steps": steps,
            "lr": lr,
            "batch_size": batch_size,
            "backup_workers": backup_workers,
            "optimizer": optimizer,
            "workers": self.workers_n,
            "ps": cluster.shape.ps,
        }
        self.error: TrainingError | None = None
        self._stop = threading.Event()
        self._fatal: TrainingError | None = None
        self._thread: threading.Thread | None = None
        self._start_step = 0
        self._cond = threading.Condition()
        self._current = -1
        self._results: queue.Queue[_Result] = queue.Queue()
        self._workers: dict[TaskName, _Worker] = {}
        self._last_checkpoint_step = -1
        self._checkpoint_errors: list[str] = []  # why checkpoint attempts failed, each reason once
        self._writer = None

    # -- control -------------------------------------------------------------
    def start(self) -> TrainingRun:
        from . import set_last_run

        set_last_run(self)
        self._thread = threading.Thread(target=self._main, name=f"tfmagic-train-{self.name}", daemon=True)
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: float | None = None, raise_error: bool = True) -> History:
        """Block until training ends; raises :class:`TrainingError` if it failed."""
        if self._thread is not None:
            deadline = None if timeout is None else time.monotonic() + timeout
            while self._thread.is_alive():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"training {self.name} still running after {timeout:g} s")
                self._thread.join(0.1 if remaining is None else min(remaining, 0.1))
        if self.error is not None and raise_error:
            raise self.error
        return self.history

    def stop(self, wait: bool = True) -> History:
        """End training after the current step (a run ended this way is not an error)."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if wait:
            return self.wait(raise_error=False)
        return self.history

    def resume(self, block: bool = True) -> TrainingRun:
        """Continue from the last checkpoint, e.g. after a lost ps was restarted."""
        if self.running:
            raise TrainingError(f"training {self.name} is still running; stop() it first")
        ckpt = self.last_checkpoint()
        if ckpt is None:
            raise TrainingError(f"training {self.name} has no checkpoint yet; start a new run instead")
        data = np.load(ckpt)
        self.initial_weights = [data[f"w{i}"] for i in range(int(data["n_weights"]))]
        self._slot_values = [data[f"s{i}"] for i in range(int(data["n_slots"]))]
        self._start_step = int(data["step"])
        self.error = None
        self._fatal = None
        self._stop.clear()
        self.history.error = None
        self.history.ended_at = None
        self.history.add_event(
            "resume", detail=f"from checkpoint at step {self._start_step}", step=self._start_step
        )
        self.start()
        if block:
            self.wait()
        return self

    def last_checkpoint(self) -> Path | None:
        path = self.checkpoint_dir / f"{self.name}.npz"
        return path if path.exists() else None

    def __repr__(self) -> str:
        if self.running:
            state = "training"
        elif self.error is not None:
            state = f"stopped: {self.error}"
        else:
            state = "done" if self._thread is not None else "not started"
        return f"<TrainingRun {self.name} ({self.mode}): {state}, {self.history.steps}/{self.steps} updates>"

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(repr(self) + "\n" + self.history.summary())

    # -- main ----------------------------------------------------------------
    def _main(self) -> None:
        with _own_executor():
            self._main_body()

    def _main_body(self) -> None:
        self.cluster.listeners.append(self._on_cluster_event)
        try:
            self._setup()
            self.history.started_at = time.time()
            if self.mode == "sync":
                self._run_sync()
            else:
                self._run_async()
            if self._fatal is not None:
                raise self._fatal
            self._checkpoint(force=True)
            self._evaluate()
        except TrainingError as exc:
            self.error = exc
        except Exception as exc:  # noqa: BLE001 - turned into a TrainingError with evidence
            self.error = self._explain(exc)
        finally:
            self._stop.set()
            with self._cond:
                self._cond.notify_all()
            for w in self._workers.values():
                if w.thread is not None:
                    w.thread.join(30)
            if self._on_cluster_event in self.cluster.listeners:
                self.cluster.listeners.remove(self._on_cluster_event)
            if self.error is not None:
                self.history.error = str(self.error)
                self.history.add_event("error", detail=str(self.error))
            self.history.ended_at = time.time()
            if self._writer is not None:
                self._writer.close()

    def _explain(self, exc: Exception) -> TrainingError:
        lost = [str(t) for t, p in self.cluster.procs.items() if not p.alive]
        if lost:
            return TrainingError(
                f"training stopped: {', '.join(lost)} is gone ({type(exc).__name__}); restart it and resume()"
            )
        return TrainingError(
            f"training stopped: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        )

    # -- setup ---------------------------------------------------------------
    def _step_now(self) -> int:
        """The latest global step this run knows of."""
        last = self.history.global_steps[-1].step if self.history.global_steps else 0
        return max(last, self._start_step)

    def _ps_tasks(self) -> list[TaskName]:
        shape = self.cluster.shape
        if shape.ps:
            return [TaskName("ps", i) for i in range(shape.ps)]
        return [TaskName("worker", 0)]

    def _setup(self) -> None:
        import tensorflow as tf

        self.cluster.connect()
        ps = self._ps_tasks()
        init = self.initial_weights or self.model.initial_weights(self.seed)
        with client.gate.call():
            self.variables = []
            for i, value in enumerate(init):
                with tf.device(ps[i % len(ps)].device):
                    self.variables.append(tf.Variable(value, name=f"w{i}"))
            with tf.device(ps[0].device):
                self.global_step = tf.Variable(self._start_step, dtype=tf.int64, name="global_step")
            self.optimizer.create_slots(self.variables)
            if getattr(self, "_slot_values", None):
                self.optimizer.load_state(self._slot_values)
        self._apply = self._make_apply() if self.mode == "sync" else None
        self._workers = {}
        for i in range(self.workers_n):
            w = _Worker(TaskName("worker", i), i)
            self._workers[w.task] = w
            if self.cluster.procs[w.task].alive:
                self._place(w)
            else:
                w.lost = True
        if self.logdir is not None:
            from .tensorboard import SummaryWriterThread

            self._writer = SummaryWriterThread(self.logdir / self.name, self.history)
        self.history.add_event(
            "start", detail=f"{self.mode}, {self.workers_n} workers", step=self._start_step
        )

    def _place(self, w: _Worker) -> None:
        """Give this worker its input (its data shard, or its own input pipeline) and step function."""
        import tensorflow as tf

        batch = self.batch_size
        model, variables, opt, gstep = self.model, self.variables, self.optimizer, self.global_step
        make_dataset = model.input_dataset(w.index, self.workers_n)
        if make_dataset is not None:
            # Traced here, run there: the pipeline (and its files) lives in the worker's process and
            # each step takes its batch from an iterator on the worker: no data through this process.
            def pipeline():
                return make_dataset().repeat().batch(batch, drop_remainder=True).prefetch(1)

            try:
                built = _kept(tf.function(pipeline).get_concrete_function())
            except Exception as exc:  # noqa: BLE001 - the user's input function
                raise TrainingError(
                    f"input_fn({w.index}, {self.workers_n}) could not be built: {type(exc).__name__}: "
                    f"{str(exc).splitlines()[0] if str(exc) else ''}"
                ) from None
            with client.gate.call(), tf.device(w.task.device):
                iterator = iter(built())
            inputs = [iterator]

            def take(k):
                return iterator.get_next()

        else:
            x, y = model.data.shard(w.index, self.workers_n)
            n = len(x)
            with client.gate.call(), tf.device(w.task.device):
                xs = tf.identity(tf.convert_to_tensor(x))
                ys = tf.identity(tf.convert_to_tensor(y))
            inputs = [xs, ys]

            def take(k):
                idx = (k * batch + tf.range(batch, dtype=tf.int64)) % n
                return tf.gather(xs, idx), tf.gather(ys, idx)

        with client.gate.call(), tf.device(w.task.device):
            counter = tf.Variable(0, dtype=tf.int64, name=f"local_step_{w.index}")
            # the model's non-trainable values (batch-norm statistics, dropout seeds): this worker's own
            state = [tf.Variable(a, trainable=False) for a in model.initial_state()]
            # async: (local step, loss, read step, new step) of the last RING steps, on the worker
            ring = (
                tf.Variable(tf.fill([RING, 4], tf.constant(-1.0, tf.float64)), name=f"ring_{w.index}")
                if self.mode == "async"
                else None
            )

        if self.mode == "async":
            limit = self.steps

            @tf.function
            def step():
                read = gstep.read_value()
                k = counter.assign_add(1) - 1
                with tf.control_dependencies([read]):
                    xb, yb = take(k)
                    with tf.GradientTape() as tape:
                        loss = model.loss(variables, xb, yb, training=True, state=state)
                grads = tape.gradient(loss, variables)

                with tf.control_dependencies(grads):
                    # An atomic fetch-and-increment: every update gets its own step
                    # number (assign_add followed by a read is two ops and races).
                    new = tf.raw_ops.ResourceCountUpTo(resource=gstep.handle, limit=2**62, T=tf.int64) + 1

                # Past `steps` (other workers took the last numbers while this one
                # computed) nothing is applied: the run has exactly `steps` updates.
                # A mask, not tf.cond: a cond's branch functions fail to be removed
                # from the remote tasks later, and that error lands on another call.
                active = new <= limit
                with tf.control_dependencies(opt.apply(grads, variables, active)):
                    new = tf.where(active, new, tf.constant(SKIPPED, tf.int64))
                row = tf.stack(
                    [
                        tf.cast(k, tf.float64),
                        tf.cast(loss, tf.float64),
                        tf.cast(read, tf.float64),
                        tf.cast(new, tf.float64),
                    ]
                )
                # the row stays on the worker until _flush_async reads the ring
                ring.scatter_nd_update([[k % RING]], [row])
                return new

        else:

            @tf.function
            def step():
                k = gstep.read_value()
                with tf.control_dependencies([k]):
                    xb, yb = take(k)
                    with tf.GradientTape() as tape:
                        loss = model.loss(variables, xb, yb, training=True, state=state)
                grads = tape.gradient(loss, variables)
                return tf.stack([tf.cast(loss, tf.float64), tf.cast(k, tf.float64)]), grads

        w.fn, w.counter, w.tensors, w.ring, w.seen_k = _kept(step), counter, inputs, ring, -1
        w.state = state
        w.rebuild = False
        w.errors = 0

    def _make_apply(self):
        import tensorflow as tf

        variables, opt, gstep = self.variables, self.optimizer, self.global_step

        @tf.function
        def apply(grad_lists):
            n = float(len(grad_lists))
            avg = [tf.add_n([g[j] for g in grad_lists]) / n for j in range(len(variables))]
            updates = opt.apply(avg, variables)
            with tf.control_dependencies(updates):
                return gstep.assign_add(1)

        return _kept(apply)

    # -- events and failures ---------------------------------------------------
    def _on_cluster_event(self, event) -> None:
        try:
            task = TaskName.parse(event.task)
        except Exception:  # noqa: BLE001 - "cluster" events
            return
        self.history.add_event(event.kind, str(task), event.detail, step=self._step_now(), when=event.time)
        if task.job == "worker" and task in self._workers:
            w = self._workers[task]
            if event.kind in ("kill", "lost"):
                w.lost = True
            elif event.kind == "restart":
                w.lost = False
                w.rebuild = True
        elif task.job == "ps" and event.kind in ("kill", "lost"):
            self._fail(self._ps_lost_error(task))
        with self._cond:
            self._cond.notify_all()

    def _ps_lost_error(self, task) -> TrainingError:
        ckpt = self.last_checkpoint()
        at = f"step {self._last_checkpoint_step}" if ckpt else "no checkpoint yet"
        return TrainingError(
            f"{task} was lost at step {self._step_now()}: the variables on it are gone. "
            f"Restart it (cluster.restart('{task}') or %tf_cluster restart {task}) and call resume() "
            f"to continue from the last checkpoint ({at})."
        )

    def _fail(self, error: TrainingError) -> None:
        if self._fatal is None:
            self._fatal = error
        self._stop.set()
        with self._cond:
            self._cond.notify_all()

    def _handle_error(self, w: _Worker, exc: Exception) -> None:
        _clear_executor()
        procs = self.cluster.procs
        dead_ps = [t for t in self._ps_tasks() if t.job == "ps" and not procs[t].alive]
        if dead_ps:
            self._fail(self._ps_lost_error(dead_ps[0]))
            return
        if type(exc).__name__ == "OutOfRangeError" and self.model.input_dataset(w.index, self.workers_n):
            self._fail(
                TrainingError(
                    f"{w.task} has no training examples: input_fn({w.index}, {self.workers_n}) returned an "
                    "empty Dataset; give every shard some examples (or train on fewer workers)"
                )
            )
            return
        proc = procs[w.task]
        if proc.alive and type(exc).__name__ in ("UnavailableError", "CancelledError"):
            # The task may be dying right now; give the owner a moment to see it.
            proc.wait_for(lambda: not proc.alive, 1.0)
        if not proc.alive:
            if not w.lost:
                w.lost = True
                self.history.add_event("lost", str(w.task), f"{type(exc).__name__}", step=self._step_now())
            return
        w.errors += 1
        self.history.add_event(
            "retry",
            str(w.task),
            f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}",
            step=self._step_now(),
        )
        if "context_id" in str(exc) or "invalid device" in str(exc):
            w.rebuild = True  # the connection was renewed under us
        if w.errors > 20:
            self._fail(
                TrainingError(f"{w.task} keeps failing: {type(exc).__name__}: {str(exc).splitlines()[0]}")
            )
        time.sleep(0.05)

    def _wait_rejoin(self, w: _Worker) -> bool:
        """Wait while ``w`` is lost; True once it can step again."""
        with self._cond:
            while w.lost and not self._stop.is_set():
                self._cond.wait(0.2)
        if self._stop.is_set():
            return False
        if w.rebuild:
            try:
                self._place(w)
                self.history.add_event("rejoin", str(w.task), step=self._step_now())
            except Exception as exc:  # noqa: BLE001
                self._handle_error(w, exc)
                return False
        return True

    # -- async ---------------------------------------------------------------
    def _run_async(self) -> None:
        for w in self._workers.values():
            w.thread = threading.Thread(
                target=_with_own_executor(self._async_worker),
                args=(w,),
                name=f"tfmagic-async-{w.task}",
                daemon=True,
            )
            w.thread.start()
        last_check, seen = time.monotonic(), -1
        while not self._stop.is_set():
            time.sleep(0.1)
            if all(w.lost for w in self._workers.values()):
                self._fail(
                    TrainingError(
                        "every worker was lost; restart them (%tf_cluster restart worker:0 ...) and resume()"
                    )
                )
            self._checkpoint()
            if self.history.steps != seen:
                seen, last_check = self.history.steps, time.monotonic()
            elif time.monotonic() - last_check > 2.0:
                # the workers' rows end the run; if none could be read for a while, the ps says
                last_check = time.monotonic()
                step = self._read_global_step()
                if step is not None and step >= self.steps:
                    self._stop.set()
        for w in self._workers.values():  # their last rows, before the weights are read
            if w.thread is not None:
                w.thread.join(30)

    def _async_worker(self, w: _Worker) -> None:
        """Step as fast as this worker can; fetch the steps' numbers in batches.

        With a synchronous executor a call returns once the worker answered,
        which gives the step's end time; the step's (local step, loss, read
        step, new step) go into a ring buffer on the worker, read for several
        steps at once: one round trip saved per step.
        """
        import tensorflow as tf

        pending: list[tuple[float, float]] = []
        last_flush = time.monotonic()
        while not self._stop.is_set():
            if (w.lost or w.rebuild) and not self._wait_rejoin(w):
                pending.clear()
                continue
            t0 = time.time()
            try:
                with client.gate.call(), tf.device(w.task.device):
                    w.fn()
            except Exception as exc:  # noqa: BLE001 - sorted out by _handle_error
                self._flush_async(w, pending)
                self._handle_error(w, exc)
                continue
            pending.append((t0, time.time()))
            w.local_step += 1
            w.errors = 0
            if len(pending) >= FETCH_EVERY or time.monotonic() - last_flush > 0.1:
                self._flush_async(w, pending)
                last_flush = time.monotonic()
        self._flush_async(w, pending, final=True)

    def _flush_async(self, w: _Worker, pending: list, final: bool = False) -> None:
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
        alive = self.cluster.procs[w.task].alive
        for _attempt in range(5 if final and alive else 1 if alive else 0):
            try:
                with client.gate.call():
                    rows = w.ring.numpy()
                break
            except Exception as exc:  # noqa: BLE001 - see the docstring
                _clear_executor()
                error = exc
                if not self.cluster.procs[w.task].alive:
                    break  # the worker died with these numbers; the steps did happen
                if final:
                    time.sleep(0.1)
        if rows is None:
            if error is not None and not final and type(error).__name__ not in _CONNECTION_ERRORS:
                # The steps' own failure, reported on this read (e.g. the worker's input ran
                # out): handled as a failed step, not retried silently forever.
                self._handle_error(w, error)
            if final or not self.cluster.procs[w.task].alive:
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
        for (t0, t1), (k, loss, read, new) in zip(times, fresh):
            new = int(new)
            if new == SKIPPED:  # came after the last update: nothing was applied
                self._stop.set()
                continue
            self.history.add_step(
                StepRecord(
                    str(w.task),
                    int(read),
                    t0,
                    t1,
                    float(loss),
                    mode="async",
                    local_step=int(k),
                    staleness=max(0, new - 1 - int(read)),
                    examples=self.batch_size,
                    update=new,
                )
            )
            self.history.add_global(GlobalStep(new, t1, float(loss), aggregated=(str(w.task),)))
            if new >= self.steps:
                self._stop.set()  # the last update: done
        pending.clear()

    # -- sync ----------------------------------------------------------------
    def _run_sync(self) -> None:
        # A resumed run starts its workers afresh: they must not see the step the lost run
        # had reached (they would compute it, the loop would wait for an earlier one: a hang
        # found by the sync ps-loss test), nor its gradients still queued.
        with self._cond:
            self._current = -1
        while not self._results.empty():
            self._results.get_nowait()
        for w in self._workers.values():
            w.thread = threading.Thread(
                target=_with_own_executor(self._sync_worker),
                args=(w,),
                name=f"tfmagic-sync-{w.task}",
                daemon=True,
            )
            w.thread.start()
        R = self.replicas_to_aggregate
        apply_device = self._ps_tasks()[0].device
        for t in range(self._start_step, self.steps):
            with self._cond:
                self._current = t
                self._cond.notify_all()
            collected = self._collect(t, R, apply_device)
            if collected is None:
                return
            now = time.time()
            for r in collected:
                self.history.add_step(
                    StepRecord(
                        str(r.worker.task),
                        t,
                        r.start,
                        r.end,
                        r.loss,
                        mode="sync",
                        local_step=r.worker.local_step,
                        applied=True,
                        examples=self.batch_size,
                        update=t + 1,
                    )
                )
            losses = [r.loss for r in collected]
            self.history.add_global(
                GlobalStep(
                    t + 1,
                    now,
                    float(np.mean(losses)),
                    aggregated=tuple(str(r.worker.task) for r in collected),
                )
            )
            self._checkpoint()
        # drain what arrives late for the last step
        while True:
            try:
                self._record_dropped(self._results.get_nowait())
            except queue.Empty:
                break

    def _collect(self, t: int, R: int, apply_device: str) -> list[_Result] | None:
        """The first ``R`` gradients for step ``t``, averaged and applied; None if stopped."""
        import tensorflow as tf

        collected: list[_Result] = []
        while True:
            while len(collected) < R:
                if self._stop.is_set():
                    return None
                self._check_enough_workers(t, R)
                try:
                    res = self._results.get(timeout=0.1)
                except queue.Empty:
                    continue
                if res.step == t and not res.worker.lost:
                    collected.append(res)
                elif res.step != t:
                    self._record_dropped(res)
                    if res.step > t and self._was_applied(t):
                        # the ps is past t: step t's update happened (see _was_applied)
                        return collected
            try:
                with client.gate.call(), tf.device(apply_device):
                    self._apply([r.grads for r in collected]).numpy()
                return collected
            except Exception:  # noqa: BLE001 - a worker (or the ps) died since it answered
                _clear_executor()
                for r in collected:
                    proc = self.cluster.procs[r.worker.task]
                    proc.wait_for(lambda p=proc: not p.alive, 1.0)
                    if not proc.alive:
                        r.worker.lost = True
                dead_ps = [p for p in self._ps_tasks() if p.job == "ps" and not self.cluster.procs[p].alive]
                if dead_ps:
                    raise self._ps_lost_error(dead_ps[0]) from None
                if self._was_applied(t):
                    # The update ran; the failure was another call's, reported on this one.
                    # Collecting again would wait forever: the workers that took part are
                    # done with step t, the others now read t + 1.
                    return collected
                if not any(r.worker.lost for r in collected):
                    raise
                collected = [r for r in collected if not r.worker.lost]

    def _was_applied(self, t: int) -> bool:
        """Whether the ps already holds step ``t``'s update.

        TensorFlow can report a failure on a later call than the one that
        failed (seen here: an apply raised after a worker was killed, yet the
        ps had counted the step), so after a failed apply the ps is asked.
        False when it cannot be read (the caller then treats the apply as
        not done, as before).
        """
        for _attempt in range(5):
            step = self._read_global_step()
            if step is not None:
                return step > t
            time.sleep(0.1)
        return False

    def _check_enough_workers(self, t: int, R: int) -> None:
        alive = [w for w in self._workers.values() if not w.lost]
        if len(alive) >= R:
            return
        lost = [str(w.task) for w in self._workers.values() if w.lost]
        if self.backup_workers == 0:
            raise TrainingError(
                f"sync training needs all {self.workers_n} workers every step (backup_workers=0) and "
                f"{', '.join(lost)} was lost at step {t}. Restart it (%tf_cluster restart {lost[0]}) and "
                "resume(), or train with backup_workers=1 or mode='async'."
            )
        raise TrainingError(
            f"sync training aggregates {R} gradients per step but only {len(alive)} workers are left "
            f"({', '.join(lost)} lost at step {t}); restart one and resume()."
        )

    def _record_dropped(self, res: _Result) -> None:
        self.history.add_step(
            StepRecord(
                str(res.worker.task),
                res.step,
                res.start,
                res.end,
                res.loss,
                mode="sync",
                local_step=res.worker.local_step,
                applied=False,
                dropped=True,
                examples=self.batch_size,
            )
        )
        self.history.add_event(
            "dropped", str(res.worker.task), f"stale gradient of step {res.step}", step=res.step
        )

    def _sync_worker(self, w: _Worker) -> None:
        import tensorflow as tf

        while not self._stop.is_set():
            with self._cond:
                while not self._stop.is_set() and self._current <= w.last_step:
                    self._cond.wait(0.2)
            if self._stop.is_set():
                return
            if (w.lost or w.rebuild) and not self._wait_rejoin(w):
                continue
            step = self._current
            t0 = time.time()
            try:
                with client.gate.call(), tf.device(w.task.device):
                    head, grads = w.fn()
                    loss, read = head.numpy()
            except Exception as exc:  # noqa: BLE001 - sorted out by _handle_error
                self._handle_error(w, exc)
                continue
            w.errors = 0
            w.last_step = step
            w.local_step += 1
            self._results.put(_Result(int(read), w, float(loss), grads, t0, time.time()))

    # -- checkpoints and evaluation ----------------------------------------------
    def _checkpoint(self, force: bool = False) -> None:
        step = self._step_now()
        if not force and step - max(self._last_checkpoint_step, self._start_step) < self.checkpoint_every:
            return
        try:
            weights, slots, step = self._snapshot()
        except Exception as exc:  # noqa: BLE001 - a lost ps; reported by the step that sees it
            _clear_executor()
            lines = str(exc).splitlines() or [""]
            where = [ln for ln in lines if "from remote target" in ln]  # which task answered so
            why = f"{type(exc).__name__}: {lines[0]}" + (f" [{where[0].strip()}]" if where else "")
            if why not in self._checkpoint_errors:
                self._checkpoint_errors.append(why)
            return
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        path = self.checkpoint_dir / f"{self.name}.npz"
        tmp = self.checkpoint_dir / f".{self.name}.tmp.npz"
        arrays = {f"w{i}": w for i, w in enumerate(weights)} | {f"s{i}": s for i, s in enumerate(slots)}
        np.savez(tmp, step=step, n_weights=len(weights), n_slots=len(slots), **arrays)
        os.replace(tmp, path)
        self._last_checkpoint_step = step
        self.history.checkpoint = str(path)

    def _ps_alive(self) -> bool:
        """Whether every ps task runs: a read of a ps that died fails once, then waits for it forever.

        Measured here: this process's first read after a ps died raises
        UnavailableError, the next ones wait for it to come back; a read
        made through a worker waits at once.  So the ps is read only while
        it runs, directly from here.
        """
        procs = self.cluster.procs
        return all(procs[t].alive for t in self._ps_tasks() if t in procs) and self._fatal is None

    def _snapshot(self):
        """Weights, optimizer slots and the global step, read from the ps."""
        if not self._ps_alive():
            raise TrainingError("a ps task is not running")
        tensors = [*self.variables, *self.optimizer.slots, self.global_step]
        with client.gate.call():
            # One at a time, on purpose: asking for every copy first is one round trip instead
            # of ten, but when the ps dies mid-read the copies still queued wait for it forever
            # (measured: the run then never reported the lost ps).  One by one, the read that
            # meets the dead ps fails and nothing else is waiting.
            values = [t.numpy() for t in tensors]
        n = len(self.variables)
        # async calls after the last update still count the step up (and change nothing)
        return values[:n], values[n:-1], min(int(values[-1]), self.steps)

    def _read_global_step(self) -> int | None:
        """The global step as the ps holds it (None if it cannot be read now)."""
        if not self._ps_alive():
            return None
        try:
            with client.gate.call():
                return int(self.global_step.numpy())
        except Exception:  # noqa: BLE001 - a task coming or going; the next check will tell
            _clear_executor()
            return None

    def weights(self) -> list[np.ndarray]:
        """The current weights, read from the ps tasks."""
        with client.gate.call():
            return [v.numpy() for v in self.variables]

    def _worker_state(self) -> list[np.ndarray] | None:
        """The first running worker's non-trainable values (None: the model's initial ones)."""
        for w in self._workers.values():
            if w.state and not w.lost and self.cluster.procs[w.task].alive:
                try:
                    with client.gate.call():
                        return [v.numpy() for v in w.state]
                except Exception:  # noqa: BLE001 - a worker lost at the very end: try the next
                    _clear_executor()
        return None

    def _evaluate(self) -> None:
        import tensorflow as tf

        weights = self.weights()
        data = self.model.data
        state = self._worker_state()
        with tf.device("/job:localhost/replica:0/task:0/device:CPU:0"):
            w = [tf.constant(a) for a in weights]
            st = None if state is None else [tf.constant(a) for a in state]
            self.history.final_loss = float(
                self.model.loss(w, tf.constant(data.x_test), tf.constant(data.y_test), state=st)
            )
            if self.model.classifier:
                self.history.final_accuracy = float(
                    self.model.accuracy(w, tf.constant(data.x_test), tf.constant(data.y_test), state=st)
                )
        self.final_weights = weights
        self.final_state = state  # the first running worker's non-trainable values (None: none)
