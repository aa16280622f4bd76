"""What runs on each worker: its input, and the step function the engine calls there.

Each worker holds its own shard of the data in its own memory (or runs its
own ``tf.data`` pipeline there) and a step function traced here and run
there:

* **sync** (:func:`sync_step`): read the global step, take that step's
  batch, return (loss, step read) and the gradients, which stay on the
  worker until the aggregation pulls them;
* **async** (:func:`async_step`): read the parameters, compute a gradient,
  take a step number from the ps (an atomic fetch-and-increment) and apply
  the gradient at once; the step's numbers go into a ring buffer on the
  worker that the engine reads several steps at a time.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import client
from ..errors import TrainingError
from ..spec import TaskName

#: async: how many rows of (local step, loss, read step, new step) a worker keeps
RING = 512
#: async: the step number in the ring of a call that came after the last update (nothing applied)
SKIPPED = 0

#: Every tf.function the engine made, kept for the life of the process.
#: Dropping one makes TensorFlow remove it from every task; after a task was
#: restarted that removal can fail ("Tried to remove non-existent function")
#: on a stream other calls share, and the error lands on the next call to
#: that task, often another run's.  Kept, a run's functions cost about 2 MB.
_FUNCTIONS: list = []


def kept(fn):
    _FUNCTIONS.append(fn)
    return fn


@contextlib.contextmanager
def own_executor():
    """A synchronous eager executor for this thread, as ClusterCoordinator uses.

    With TensorFlow's shared (asynchronous) executor, an error from one
    worker surfaces on another thread's next op, and a call can wait behind
    another thread's call to a dead task; one executor per thread keeps each
    worker's calls and errors its own.
    """
    from tensorflow.python.eager import context, executor

    from .params import clear_executor

    ex = executor.new_executor(enable_async=False)
    try:
        with context.executor_scope(ex):
            yield
    finally:
        clear_executor(ex)


def with_own_executor(fn):
    def run(*args):
        with own_executor():
            return fn(*args)

    return run


@dataclass
class Worker:
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


def _input(w: Worker, model, batch: int, workers: int, who: str):
    """The worker's input, placed on it; returns (tensors to keep, take(k) -> batch)."""
    import tensorflow as tf

    make_dataset = model.input_dataset(w.index, workers)
    if make_dataset is not None:
        # Traced here, run there: the pipeline (and its files) lives in the worker's process and
        # each step takes its batch from an iterator on the worker: no data through this process.
        def pipeline():
            return make_dataset().repeat().batch(batch, drop_remainder=True).prefetch(1)

        try:
            built = kept(tf.function(pipeline).get_concrete_function())
        except Exception as exc:  # noqa: BLE001 - the user's input function
            raise TrainingError(
                f"input_fn({w.index}, {workers}) could not be built: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}"
            ) from None
        with client.gate.call(who), tf.device(w.task.device):
            iterator = iter(built())
        return [iterator], lambda k: iterator.get_next()
    x, y = model.data.shard(w.index, workers)
    n = len(x)
    with client.gate.call(who), tf.device(w.task.device):
        xs = tf.identity(tf.convert_to_tensor(x))
        ys = tf.identity(tf.convert_to_tensor(y))

    def take(k):
        idx = (k * batch + tf.range(batch, dtype=tf.int64)) % n
        return tf.gather(xs, idx), tf.gather(ys, idx)

    return [xs, ys], take


def place_worker(
    w: Worker, *, mode: str, model, params, batch: int, workers: int, limit: int, who: str
) -> None:
    """Give ``w`` its input (its data shard, or its own input pipeline) and its step function."""
    import tensorflow as tf

    inputs, take = _input(w, model, batch, workers, who)
    with client.gate.call(who), tf.device(w.task.device):
        counter = tf.Variable(0, dtype=tf.int64, name=f"local_step_{w.index}")
        # the model's non-trainable values (batch-norm statistics, dropout seeds): this worker's own
        state = [tf.Variable(a, trainable=False) for a in model.initial_state()]
        ring = (
            tf.Variable(tf.fill([RING, 4], tf.constant(-1.0, tf.float64)), name=f"ring_{w.index}")
            if mode == "async"
            else None
        )
    if mode == "async":
        w.fn = kept(async_step(model, params, take, state, counter, ring, limit))
    else:
        w.fn = kept(sync_step(model, params, take, state, params.buffers[w.index]))
    w.counter, w.tensors, w.ring, w.seen_k, w.state = counter, inputs, ring, -1, state
    w.rebuild = False
    w.errors = 0


def sync_step(model, params, take, state, buffers):
    """A gradient from the current parameters, left in this worker's buffers on the ps."""
    import tensorflow as tf

    variables, gstep = params.variables, params.global_step

    @tf.function
    def step():
        k = gstep.read_value()
        with tf.control_dependencies([k]):
            xb, yb = take(k)
            with tf.GradientTape() as tape:
                loss = model.loss(variables, xb, yb, training=True, state=state)
        grads = tape.gradient(loss, variables)
        writes = [b.assign(g) for b, g in zip(buffers, grads, strict=True)]
        with tf.control_dependencies(writes):
            return tf.stack([tf.cast(loss, tf.float64), tf.cast(k, tf.float64)])

    return step


def async_step(model, params, take, state, counter, ring, limit):
    """Read, compute, take a step number, apply: one call to the worker per update."""
    import tensorflow as tf

    variables, opt, gstep = params.variables, params.optimizer, params.global_step

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

        # Past `limit` (other workers took the last numbers while this one
        # computed) nothing is applied: the run has exactly `limit` updates.
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
        # the row stays on the worker until the engine reads the ring
        ring.scatter_nd_update([[k % RING]], [row])
        return new

    return step


def make_apply(params):
    """Sync: average the gradients of the workers in ``chosen`` (a 0/1 vector) and apply them once, on the ps."""
    import tensorflow as tf

    variables, opt, gstep, buffers = params.variables, params.optimizer, params.global_step, params.buffers

    @tf.function
    def apply(chosen):
        n = tf.reduce_sum(chosen)
        avg = []
        for j, v in enumerate(variables):
            with tf.device(v.device):
                # tf.where, not a product: a buffer being rewritten by a late worker is never read
                parts = [
                    tf.where(chosen[i] > 0, row[j], tf.zeros_like(row[j])) for i, row in enumerate(buffers)
                ]
                avg.append(tf.add_n(parts) / n)
        updates = opt.apply(avg, variables)
        with tf.control_dependencies(updates):
            return gstep.assign_add(1)

    return kept(apply)
