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
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import client
from ..errors import TrainingError
from ..spec import TaskName

#: async: how many rows a worker keeps of (local step, loss, read step, new step, t0, t_read,
#: t_grad, t_applied): the last three are on-device timestamps splitting the step's time
RING = 512
ROW = 8
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


#: seconds a worker's thread waits for its executor to drain when it ends (a live worker's is done
#: at once; a killed worker's can wait on the dead task for gRPC's minute)
EXECUTOR_CLEAR_S = 2.0
#: TensorFlow's streaming enqueue (one gRPC stream per remote context) is off for the async
#: engine's threads: a call on the stream of a worker killed a moment before waited out gRPC's
#: minute before it failed, in half the kills under async (issue 22, item 11), and a unary call to
#: a dead task fails at once. Switching only the record reads to unary calls left the steps' calls
#: waiting. The sync engine keeps the stream: with unary calls, one SIGSTOPped worker held sync
#: with a backup worker still (test_abuse). The cost, side by side: bench/async_vs_coordinator.py
ASYNC_STREAMING_ENQUEUE = False


#: wrappers of threads' previous executors, never collected (see own_executor)
_KEPT_WRAPPERS: list = []


@contextlib.contextmanager
def own_executor(for_async: bool = False):
    """A synchronous eager executor for this thread, as ClusterCoordinator uses.

    With TensorFlow's shared (asynchronous) executor, an error from one
    worker surfaces on another thread's next op, and a call can wait behind
    another thread's call to a dead task; one executor per thread keeps each
    worker's calls and errors its own.
    """
    from tensorflow.python.eager import context, executor

    from .params import clear_executor

    streaming = ASYNC_STREAMING_ENQUEUE if for_async else True
    ex = executor.new_executor(enable_async=False, enable_streaming_enqueue=streaming)
    ctx = context.context()
    # TensorFlow's executor_scope would do this, but the wrapper it makes of the thread's previous
    # executor (the context's shared one) waits, when it is collected, for every op pending there,
    # another thread's included: a call to a node that died without a word held the run's threads
    # a minute, or for ever (measured on a Slurm node killed with its link down). The wrapper is
    # kept instead (a few bytes a thread; it owns nothing).
    previous = ctx.executor
    _KEPT_WRAPPERS.append(previous)
    ctx.executor = ex
    try:
        yield
    finally:
        ctx.executor = previous
        # thrown away now: a call still waiting on a dead task finishes (or fails) in the background
        clear_executor(ex, timeout=EXECUTOR_CLEAR_S)


def with_own_executor(fn, for_async: bool = False):
    def run(*args):
        with own_executor(for_async):
            return fn(*args)

    return run


def join_worker_threads(workers, control) -> list[str]:
    """Wait for the worker threads of a run that is ending: 30 s in all when it finished (their last
    rows), 2 s in all when it failed or was stopped, since a thread may be waiting on a task that no
    longer answers (a node gone without a word: its call waits until TCP gives up). Returns the
    workers whose threads still wait."""
    deadline = time.monotonic() + (2 if control.reason or control.fatal else 30)
    for w in workers:
        if w.thread is not None:
            w.thread.join(max(0.0, deadline - time.monotonic()))
    return [str(w.task) for w in workers if w.thread is not None and w.thread.is_alive()]


def start_worker_thread(w, work, policy, kind: str) -> None:
    """``work(w)`` on a thread of its own (with its own executor); a worker leaving the cluster is
    retired once its last call has returned (and, async, its rows are read): its task may go then."""

    def thread() -> None:
        try:
            work(w)
        finally:
            if w.leaving:
                policy.retire(w)

    w.thread = threading.Thread(
        target=with_own_executor(thread, for_async=kind == "async"),
        name=f"tfmagic-{kind}-{w.task}",
        daemon=True,
    )
    w.thread.start()


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
    landed: int = 0  # async: of its steps, how many updates are on the ps (SSP's clock)
    thread: threading.Thread | None = None
    tensors: list = field(default_factory=list)
    ring: object = None
    seen_k: int = -1
    state: list = field(default_factory=list)  # the model's non-trainable values, on this worker
    take: Callable | None = None  # k -> this worker's batch for step k (built on the worker)
    fn_first: Callable | None = None  # paced async: the first call (compute only) ...
    fn_last: Callable | None = None  # ... and the last one (apply only)
    started: bool = False  # paced async: a gradient is in flight
    comm: tuple = (0.0, 0.0)  # paced async: its last call's seconds applying and reading
    device_end: float | None = None  # async: when its last recorded step ended on the worker
    warm_end: float | None = None  # when its first (warm-up) call ended
    # membership (see tfmagic.elastic): a worker that joined during the run takes part once placed
    # (sync: from a step boundary); one leaving gets no new step and is retired once its last returned
    joined: bool = True
    leaving: bool = False
    drain: bool = True  # leaving: finish (True) or drop (False) its step not yet applied
    retired: bool = False

    @property
    def dropping(self) -> bool:
        """Leaving without finishing its step: no gradient of it counts any more."""
        return self.leaving and not self.drain


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
    w: Worker, *, kind: str, model, params, batch: int, workers: int, limit: int, who: str, per_call: int = 1
) -> None:
    """Give ``w`` its input (its data shard, or its own input pipeline) and its step functions.

    ``kind``: ``sync`` (a gradient into its buffer on the ps), ``fused``
    (input and state only: the whole update is one function, see
    :func:`fused_update`), ``async`` (read, compute and apply in one call,
    ``per_call`` steps at a time) or ``paced`` (async split at the modelled
    step's end: each call applies the gradient the previous one computed,
    then computes the next).
    """
    import tensorflow as tf

    inputs, take = _input(w, model, batch, workers, who)
    with client.gate.call(who), tf.device(w.task.device):
        counter = tf.Variable(0, dtype=tf.int64, name=f"local_step_{w.index}")
        # the model's non-trainable values (batch-norm statistics, dropout seeds): this worker's own
        state = [tf.Variable(a, trainable=False) for a in model.initial_state()]
        ring = (
            tf.Variable(tf.fill([RING, ROW], tf.constant(-1.0, tf.float64)), name=f"ring_{w.index}")
            if kind in ("async", "paced")
            else None
        )
        pending = (
            (
                # zeros of the parameters' shape made here: zeros_like would read each one from its ps
                [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False) for v in params.variables],
                tf.Variable(tf.zeros([6], tf.float64)),
            )
            if kind == "paced"
            else None
        )
    w.take, w.state, w.counter, w.tensors, w.ring, w.seen_k = take, state, counter, inputs, ring, -1
    if kind == "sync":
        w.fn = kept(sync_step(model, params, take, state, params.buffers[w.index]))
    elif kind == "async":
        w.fn = kept(async_step(model, params, take, state, counter, ring, limit, per_call))
    elif kind == "paced":
        w.fn_first, w.fn, w.fn_last = (
            kept(f) for f in paced_steps(model, params, take, state, counter, ring, limit, pending)
        )
    if kind in ("async", "paced"):
        _trace_on_stream(w, who, [w.fn] if kind == "async" else [w.fn_first, w.fn, w.fn_last])
    w.rebuild = False
    w.errors = 0


def _trace_on_stream(w: Worker, who, fns) -> None:
    """Trace a worker's step functions now, each sent to every task on TensorFlow's stream.

    Tracing registers a function on every task of the cluster, holding the GIL. Now, while every task
    answers: `last` was first traced when a worker's last step ended, mid-run, and with a task
    stopped (SIGSTOP, a frozen machine) that froze this whole process (the fault soak). On the
    stream: on a unary executor (the async engine's and the setup's) TensorFlow waits for each task's
    answer in turn, 34 tasks x 3 functions x 32 workers of round trips, and through a modelled ps
    card (ps-scaling) 19 s of a run's setup; on the stream it sends the function and goes on.
    """
    import tensorflow as tf

    with own_executor(), client.gate.call(who), tf.device(w.task.device):
        for fn in fns:
            fn.get_concrete_function()


def _read(variables):
    """The parameters, read onto the device the step runs on (moving them is part of the step)."""
    import tensorflow as tf

    return [tf.identity(v) for v in variables]


def _gradient(model, variables, take, k, state):
    """(t_read, loss, grads, t_grad) of the batch for step ``k``, from parameters read now."""
    import tensorflow as tf

    ws = _read(variables)
    with tf.control_dependencies(ws):
        t_read = tf.timestamp()
        xb, yb = take(k)
    with tf.GradientTape() as tape:
        tape.watch(ws)
        loss = model.loss(ws, xb, yb, training=True, state=state)
    grads = tape.gradient(loss, ws)
    with tf.control_dependencies(grads):
        t_grad = tf.timestamp()
    return t_read, loss, grads, t_grad


def _f64(*xs):
    import tensorflow as tf

    return tf.stack([tf.cast(x, tf.float64) for x in xs])


def sync_step(model, params, take, state, buffers):
    """A gradient from the current parameters, left in this worker's buffers on the ps.

    Returns (loss, step read, t0, t_read, t_grad, t_pushed) as on-device timestamps.
    """
    import tensorflow as tf

    variables, gstep = params.variables, params.global_step

    @tf.function
    def step():
        t0 = tf.timestamp()
        k = gstep.read_value()
        t_read, loss, grads, t_grad = _gradient(model, variables, take, k, state)
        writes = [b.assign(g) for b, g in zip(buffers, grads, strict=True)]
        with tf.control_dependencies(writes):
            return _f64(loss, k, t0, t_read, t_grad, tf.timestamp())

    return step


def _count_and_apply(params, grads, limit, k, loss, read, t0, t_read, t_grad, ring):
    """Take an update number from the ps, apply ``grads`` if it is within ``limit``, write the ring row."""
    import tensorflow as tf

    variables, opt, gstep = params.variables, params.optimizer, params.global_step
    with tf.control_dependencies(grads):
        # An atomic fetch-and-increment: every update gets its own step number
        # (assign_add followed by a read is two ops and races).
        new = tf.raw_ops.ResourceCountUpTo(resource=gstep.handle, limit=2**62, T=tf.int64) + 1
    # Past `limit` (other workers took the last numbers while this one computed)
    # nothing is applied: the run has exactly `limit` updates.  A mask, not tf.cond:
    # a cond's branch functions fail to be removed from the remote tasks later, and
    # that error lands on another call.
    active = new <= limit
    with tf.control_dependencies(opt.apply(grads, variables, active)):
        new = tf.where(active, new, tf.constant(SKIPPED, tf.int64))
        t_applied = tf.timestamp()
    row = _f64(k, loss, read, new, t0, t_read, t_grad, t_applied)
    # the row stays on the worker until the engine reads the ring
    return ring.scatter_nd_update([[tf.cast(k, tf.int64) % RING]], [row])


def async_step(model, params, take, state, counter, ring, limit, per_call: int = 1):
    """Read, compute, take a step number, apply: ``per_call`` updates per call to the worker."""
    import tensorflow as tf

    variables, gstep = params.variables, params.global_step

    @tf.function
    def step():
        done = []
        for _ in range(per_call):  # written out: a graph loop (tf.while_loop) gained much less
            with tf.control_dependencies(done):
                t0 = tf.timestamp()
                read = gstep.read_value()
                k = counter.assign_add(1) - 1
            t_read, loss, grads, t_grad = _gradient(model, variables, take, k, state)
            done = [_count_and_apply(params, grads, limit, k, loss, read, t0, t_read, t_grad, ring)]
        with tf.control_dependencies(done):
            return tf.identity(counter.read_value())

    return step


def paced_steps(model, params, take, state, counter, ring, limit, pending):
    """Async on a paced cluster: (first, next, last) calls of a worker.

    A modelled machine reads the parameters when its step starts and applies
    its gradient when the step ends, a pace later; others' updates land in
    between (that is staleness).  So each call *applies* the gradient the
    previous call computed and *computes* the next one from the parameters
    as they are now: one call per step, at the modelled step's boundary.
    ``first`` only computes, ``last`` only applies.

    Each returns (local steps made, seconds applying, seconds reading), timed
    on the worker: on a modelled network the gradient's way to the ps and the
    parameters' way back are the links' (a full card queues them), and the
    engine counts them beside the modelled computation instead of inside it.
    """
    import tensorflow as tf

    variables, gstep = params.variables, params.global_step
    held, meta = pending  # gradient and (k, loss, read, t0, t_read, t_grad) of the step in flight

    def compute():
        t0 = tf.timestamp()
        read = gstep.read_value()
        k = counter.assign_add(1) - 1
        t_read, loss, grads, t_grad = _gradient(model, variables, take, k, state)
        writes = [h.assign(g) for h, g in zip(held, grads, strict=True)]
        writes.append(meta.assign(_f64(k, loss, read, t0, t_read, t_grad)))
        return writes, t0, t_read

    def apply_held():
        m = meta.read_value()
        grads = [h.read_value() for h in held]
        return [_count_and_apply(params, grads, limit, m[0], m[1], m[2], m[3], m[4], m[5], ring)]

    def made(t_in, t_applied, t_read):
        return _f64(counter.read_value(), t_applied - t_in, t_read - t_applied)

    @tf.function
    def first():
        t_in = tf.timestamp()
        done, t0, t_read = compute()
        with tf.control_dependencies(done):
            return made(t_in, t0, t_read)

    @tf.function
    def next_step():
        t_in = tf.timestamp()
        with tf.control_dependencies(apply_held()):
            done, t0, t_read = compute()
        with tf.control_dependencies(done):
            return made(t_in, t0, t_read)

    @tf.function
    def last():
        t_in = tf.timestamp()
        with tf.control_dependencies(apply_held()):
            t_applied = tf.timestamp()
        return made(t_in, t_applied, t_applied)

    return first, next_step, last


def make_apply(params):
    """Sync: average the gradients of the workers in ``chosen`` and apply them once, on the ps.

    ``chosen`` holds each worker's weight: 0 for a worker left out, 1 for every worker taking part
    when their batches are the same size, each one's batch size otherwise, so the average is that
    of the examples' gradients (a worker with 64 examples counts four times one with 16).

    Returns (new global step, t_apply_start, t_apply_end), timestamps on the ps.
    """
    import tensorflow as tf

    variables, opt, gstep, buffers = params.variables, params.optimizer, params.global_step, params.buffers

    @tf.function
    def apply(chosen):
        t0 = tf.timestamp()
        n = tf.reduce_sum(chosen)
        avg = []
        with tf.control_dependencies([t0]):
            for j, v in enumerate(variables):
                with tf.device(v.device):
                    # tf.where, not a product: a buffer being rewritten by a late worker is never read
                    parts = [
                        tf.where(
                            chosen[i] > 0, row[j] * tf.cast(chosen[i], row[j].dtype), tf.zeros_like(row[j])
                        )
                        for i, row in enumerate(buffers)
                    ]
                    avg.append(tf.add_n(parts) / tf.cast(n, parts[0].dtype))
        updates = opt.apply(avg, variables)
        with tf.control_dependencies(updates):
            newk = gstep.assign_add(1)
            return _f64(newk, t0, tf.timestamp())

    return kept(apply)


def fused_update(model, params, workers: list[Worker], per_call: int = 1, weights: list[float] | None = None):
    """Sync with every worker taking part: ``per_call`` whole updates in one function, called once.

    Each worker's gradient is computed on that worker, they are averaged and
    applied on the ps, all inside one multi-device function: one round trip
    to the cluster per call instead of one per worker and one for the apply
    (measured here, 2 workers: 1.6 to 2.5 times as many updates per second).
    ``per_call`` updates are written out one after the other in the graph,
    each reading what the one before applied: the same arithmetic as one
    call each.  It waits for every worker, so it serves sync without backup
    workers and without a pace; the per-worker threads serve the rest.

    ``weights`` (each worker's batch size, when they differ) makes the
    average that of the examples' gradients, as :func:`make_apply` does.

    Returns, per update, (new step, t_apply_start, t_apply_end) and, per
    worker, (loss, step read, t0, t_read, t_grad, t_arrived at the ps).
    """
    import tensorflow as tf

    variables, opt, gstep = params.variables, params.optimizer, params.global_step
    ps = params.ps_tasks[0].device

    @tf.function
    def update():
        out = []
        done = []
        for _ in range(per_call):
            with tf.device(ps), tf.control_dependencies(done):
                k = gstep.read_value()
            heads, all_grads = [], []
            for w in workers:
                with tf.device(w.task.device), tf.control_dependencies([k]):
                    t0 = tf.timestamp()
                    t_read, loss, grads, t_grad = _gradient(model, variables, w.take, k, w.state)
                with tf.device(ps):
                    arrived = [tf.identity(g) for g in grads]  # the gradient moved to the ps
                    with tf.control_dependencies(arrived):
                        t_arrived = tf.timestamp()
                heads.append(_f64(loss, k, t0, t_read, t_grad, t_arrived))
                all_grads.append(arrived)
            with tf.device(ps):
                with tf.control_dependencies(heads):
                    t_apply = tf.timestamp()
                with tf.control_dependencies([t_apply]):
                    if weights:
                        avg = [
                            tf.add_n([g[j] * w for g, w in zip(all_grads, weights, strict=True)])
                            / float(sum(weights))
                            for j in range(len(variables))
                        ]
                    else:
                        avg = [
                            tf.add_n([g[j] for g in all_grads]) / float(len(workers))
                            for j in range(len(variables))
                        ]
                with tf.control_dependencies(opt.apply(avg, variables)):
                    newk = gstep.assign_add(1)
                    out.append(tf.concat([_f64(newk, t_apply, tf.timestamp()), *heads], 0))
                done = [out[-1]]
        with tf.device(ps):
            return tf.stack(out)

    return kept(update)
