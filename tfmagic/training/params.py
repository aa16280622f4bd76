"""The parameter store: the model's variables on the ps tasks, the global step, the optimizer's slots.

Variables are spread round-robin over the ps tasks (``w0`` on ps:0, ``w1`` on
ps:1, ...), the global step lives on ps:0, and each slot (momentum,
Adagrad's accumulator) beside its weight.  A cluster without ps keeps them
on worker:0.  Reads go to the ps only while it runs (see :meth:`ps_alive`):
this process's first read after a ps died raises, the next ones wait for it
for ever.
"""

from __future__ import annotations

import time

import numpy as np

from .. import client, variable_map
from ..cluster import membership as elastic
from ..errors import TaskLost
from ..spec import TaskName
from .optimizers import Optimizer


class ParameterStore:
    """Where a run's shared state lives, and how it is read back."""

    def __init__(self, cluster, optimizer: Optimizer, who: str) -> None:
        self.cluster = cluster
        self.optimizer = optimizer
        self.who = who  # names this run's remote calls (see client.gate)
        self.variables: list = []
        self.global_step = None
        #: sync: where each worker leaves its gradient, beside each variable on the ps
        self.buffers: list[list] = []
        #: the model's names for its weights (``dense/kernel``), for the placement map
        self.names: list[str] = []

    @property
    def ps_tasks(self) -> list[TaskName]:
        """The ps tasks the variables are spread over: every ps but one being removed (see tfmagic.elastic)."""
        shape = self.cluster.shape
        ps = [TaskName("ps", i) for i in range(shape.ps)]
        staying = [t for t in ps if elastic.departure(self.cluster.id, t) is None]
        return (staying or ps) if shape.ps else [TaskName("worker", 0)]

    def held_on(self, task: TaskName) -> list[str]:
        """The names of what this run keeps on ``task``: variables, their slots, gradient buffers."""

        def on(v) -> bool:
            try:
                return TaskName.parse(v.device) == task
            except Exception:  # noqa: BLE001 - a device string that names no task: not on it
                return False

        names = [v.name.split(":")[0] for v in self.variables]
        out = [n for n, v in zip(names, self.variables) if on(v)]
        out += [f"{n} (slot)" for n, s in zip(names, self.optimizer.slots) if on(s)]
        if self.global_step is not None and on(self.global_step):
            out.append("global_step")
        out += [b.name.split(":")[0] for row in self.buffers for b in row if on(b)]
        return out

    def place(self, weights: list[np.ndarray], step: int, slots: list[np.ndarray] | None = None) -> None:
        """Create the variables (and slots, and the global step at ``step``) on the ps tasks."""
        import tensorflow as tf

        ps = self.ps_tasks
        made_by = variable_map.creator(
            self.cluster.id, f"training {self.who.split(' (')[0].removeprefix('training run ')}"
        )
        with client.gate.call(self.who), tf.variable_creator_scope(made_by):
            self.variables = []
            for i, value in enumerate(weights):
                with tf.device(ps[i % len(ps)].device):
                    self.variables.append(
                        tf.Variable(value, name=self.names[i] if i < len(self.names) else f"w{i}")
                    )
            with tf.device(ps[0].device):
                self.global_step = tf.Variable(step, dtype=tf.int64, name="global_step")
            self.optimizer.create_slots(self.variables)
            if slots:
                self.optimizer.load_state(slots)
            self.check_handles()

    def check_handles(self) -> None:
        """Use every variable's handle once, and wait: raises what a handle is poisoned with.

        Why (issue 22's fault 4): a variable made just as the network relay restarted can exist on
        the ps while this process's handle to it is poisoned ("SetRemoteShape status: UNAVAILABLE:
        Socket closed" in TensorFlow's log); every later op on it then fails at once with "Socket
        closed", without a connection attempt, for the whole run (bench/relay_restart.py: about 1 run
        in 25). Raised here, the run's setup starts again (the caller's retry) with new variables.
        """
        import tensorflow as tf

        handles = [*self.variables, *self.optimizer.slots, self.global_step]
        checks = []
        for v in handles:
            if v is None:
                continue
            with tf.device(v.device):
                checks.append(tf.raw_ops.VarIsInitializedOp(resource=v.handle))
        for check in checks:
            check.numpy()

    def make_buffers(self, workers: int) -> None:
        """Sync: one gradient buffer per worker and variable, on the variable's ps.

        A worker's step writes its gradient there within its own call, so the
        update needs nothing more from the worker: a worker stopped right
        after it answered (SIGSTOP) cannot hold up the update that uses its
        gradient, as it did when the ps pulled the gradient from it.
        """
        import tensorflow as tf

        made_by = variable_map.creator(self.cluster.id, "sync gradient buffers")
        with client.gate.call(self.who), tf.variable_creator_scope(made_by):
            self.buffers = []
            for i in range(workers):
                row = []
                for j, v in enumerate(self.variables):
                    with tf.device(v.device):
                        row.append(tf.Variable(tf.zeros_like(v), trainable=False, name=f"grad_{i}_{j}"))
                self.buffers.append(row)

    def add_buffers(self, workers: int) -> bool:
        """Sync: buffers for workers that joined during the run (rows up to ``workers``); whether any were made."""
        import tensorflow as tf

        if len(self.buffers) >= workers:
            return False
        made_by = variable_map.creator(self.cluster.id, "sync gradient buffers")
        with client.gate.call(self.who), tf.variable_creator_scope(made_by):
            for i in range(len(self.buffers), workers):
                row = []
                for j, v in enumerate(self.variables):
                    with tf.device(v.device):
                        row.append(tf.Variable(tf.zeros_like(v), trainable=False, name=f"grad_{i}_{j}"))
                self.buffers.append(row)
        return True

    def respread(self) -> tuple[int, list[str]]:
        """Move each variable (and its slot) whose round-robin ps changed to it: (bytes moved, names).

        After a ps joined, or while one is being removed (:attr:`ps_tasks`
        leaves it out), ``w{i}`` belongs on ``ps:{i % n}`` of the ps that
        stay; a new variable is made there from the old one's value (copied
        from ps to ps) and takes its place in the run.  The caller pauses
        every step that uses the variables and rebuilds the step functions
        after.  Gradient buffers (the per-worker sync loop's) are not moved:
        that loop never moves its variables while it trains (see
        :meth:`drop_buffers_on`).
        """
        import tensorflow as tf

        ps = self.ps_tasks
        moved, size = [], 0
        made_by = variable_map.creator(
            self.cluster.id, f"training {self.who.split(' (')[0].removeprefix('training run ')}"
        )
        slots = self.optimizer.slots
        with client.gate.call(self.who), tf.variable_creator_scope(made_by):
            for i, v in enumerate(self.variables):
                target = ps[i % len(ps)]
                if TaskName.parse(v.device) == target:
                    continue
                with tf.device(target.device):
                    self.variables[i] = tf.Variable(v.read_value(), name=v.name.split(":")[0])
                    size += v.dtype.size * int(v.shape.num_elements() or 0)
                    if i < len(slots):
                        old = slots[i]
                        slots[i] = tf.Variable(old.read_value(), trainable=False)
                        size += old.dtype.size * int(old.shape.num_elements() or 0)
                slot = " and its slot" if i < len(slots) else ""
                moved.append(f"{v.name.split(':')[0]}{slot} to {target}")
        return size, moved

    def drop_buffers_on(self, task: TaskName) -> bool:
        """Forget the sync gradient buffers if any is on ``task`` (a run that ended: a new start makes them)."""
        if any(TaskName.parse(b.device) == task for row in self.buffers for b in row):
            self.buffers = []
            return True
        return False

    def ps_alive(self) -> bool:
        """Whether every ps task runs (False once the cluster stopped: nothing to read then)."""
        procs = self.cluster.procs
        ps = [t for t in self.ps_tasks if t.job == "ps"]
        return self.cluster.running and all(t in procs and procs[t].alive for t in ps)

    def dead_ps(self) -> TaskName | None:
        procs = self.cluster.procs
        for t in self.ps_tasks:
            if t.job == "ps" and (t not in procs or not procs[t].alive):
                return t
        return None

    def snapshot(self, limit: int) -> tuple[list[np.ndarray], list[np.ndarray], int]:
        """Weights, optimizer slots and the global step (at most ``limit``), read from the ps."""
        if not self.ps_alive():
            raise TaskLost("a ps task is not running")
        tensors = [*self.variables, *self.optimizer.slots, self.global_step]
        with client.gate.call(self.who, self.ps_tasks, "a checkpoint read"):
            # One at a time, on purpose: asking for every copy first is one round trip instead
            # of ten, but when the ps dies mid-read the copies still queued wait for it forever
            # (measured: the run then never reported the lost ps).  One by one, the read that
            # meets the dead ps fails and nothing else is waiting.
            values = [t.numpy() for t in tensors]
        n = len(self.variables)
        # async calls after the last update still count the step up (and change nothing)
        return values[:n], values[n:-1], min(int(values[-1]), limit)

    def read_step(self) -> int | None:
        """The global step as the ps holds it (None if it cannot be read now)."""
        if not self.ps_alive():
            return None
        try:
            with client.gate.call(self.who):
                return int(self.global_step.numpy())
        except Exception:  # noqa: BLE001 - a task coming or going; the next check will tell
            clear_executor()
            return None

    def settled_step(self, attempts: int = 5) -> int | None:
        """:meth:`read_step`, tried ``attempts`` times 0.1 s apart: a read can fail for a moment
        after the cluster changed under the connection (a worker killed, a task restarted)."""
        for attempt in range(attempts):
            step = self.read_step()
            if step is not None or attempt == attempts - 1:
                return step
            time.sleep(0.1)
        return None

    def weights(self) -> list[np.ndarray]:
        """The current weights, read from the ps tasks."""
        with client.gate.call(self.who):
            return [v.numpy() for v in self.variables]


def clear_executor(ex=None, timeout: float | None = None) -> None:
    """Forget a failed call's error, so the executor can be used (and deleted) quietly.

    With ``timeout``, for an executor about to be thrown away: wait at most that long, and leave the
    rest to a background thread. An executor whose worker was killed can wait a minute on a call to
    the dead task (gRPC's deadline) before it gives up, and the run's end waited with it (issue 22,
    item 11); nothing of the dead worker's is still to come.
    """
    from tensorflow.python.eager import context

    ex = ex or context.context().executor

    def clear() -> None:
        try:
            ex.wait()
        except Exception:  # noqa: BLE001 - the error was already handled where it happened
            pass
        try:
            ex.clear_error()
        except Exception:  # noqa: BLE001
            pass

    if timeout is None:
        clear()
        return

    def drain() -> None:
        # An executor may still hold calls to a task that no longer answers (a node gone without a
        # word) after its error is cleared, and its deletion waits for them: this thread keeps it
        # until a wait passes (each failed wait clears its error and waits again), so that the
        # deletion that waits is never the worker's (measured: a run on a Slurm node that died
        # ended 58 s after the job did, or not at all, its threads in Executor.__del__).
        for _ in range(1000):
            try:
                ex.wait()
                return
            except Exception:  # noqa: BLE001 - the error was already handled where it happened
                try:
                    ex.clear_error()
                except Exception:  # noqa: BLE001
                    return

    import threading

    waiter = threading.Thread(target=drain, name="tfmagic-executor-clear", daemon=True)
    waiter.start()  # holds the executor until TensorFlow lets go of it
    waiter.join(timeout)
