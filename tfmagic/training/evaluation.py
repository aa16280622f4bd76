"""How a run's model is measured: the held-out probe while it trains, and the final evaluation.

A sync update's loss is the mean over the batches it averaged, an async
update's is one batch: curves of those are not the same measure.  The probe
is (``History.evals``): every ``probe_every`` updates, the loss on the same
held-out examples whatever the mode, so modes compare fairly.  Both read the
weights from the ps between steps and compute here, on the client's CPU.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from .. import client
from .params import clear_executor
from .steps import own_executor

if TYPE_CHECKING:
    from .run import TrainingRun

#: the held-out examples every mode's loss is measured on during training (the same for all)
PROBE_EXAMPLES = 256
_CPU = "/job:localhost/replica:0/task:0/device:CPU:0"


def probe(run: TrainingRun) -> None:
    """The probe thread's body: the held-out loss every ``max(10, steps // 40)`` updates until the run stops."""
    import tensorflow as tf

    every = max(10, run.steps // 40)
    data = run.model.data
    x, y = data.x_test[:PROBE_EXAMPLES], data.y_test[:PROBE_EXAMPLES]
    if not len(x):
        return
    state = [tf.constant(a) for a in run.model.initial_state()] or None
    next_at = every
    with own_executor():
        while not run.control.stopping:
            if run.history.steps < next_at:
                run.control.stopped.wait(0.05)
                continue
            step = run.history.steps
            next_at = (step // every + 1) * every
            if not run.params.ps_alive():
                continue
            try:
                weights = run.params.weights()
            except Exception:  # noqa: BLE001 - a task coming or going: the next probe tries again
                clear_executor()
                continue
            with tf.device(_CPU):
                w = [tf.constant(a) for a in weights]
                loss = float(run.model.loss(w, tf.constant(x), tf.constant(y), state=state))
            run.probed = (step, weights)  # the TensorBoard writer's weight histograms
            run.history.add_eval(step, time.time(), loss)
            run.notes.note(f"update {step}/{run.steps}, held-out loss {loss:.4f}")


def worker_state(run: TrainingRun) -> list[np.ndarray] | None:
    """The first running worker's non-trainable values (None: the model's initial ones)."""
    for w in run.policy.workers.values():
        proc = run.cluster.procs.get(w.task)
        if w.state and not w.lost and proc is not None and proc.alive:
            try:
                with client.gate.call(run.who):
                    return [v.numpy() for v in w.state]
            except Exception:  # noqa: BLE001 - a worker lost at the very end: try the next
                clear_executor()
    return None


def evaluate(run: TrainingRun) -> None:
    """The final loss (and accuracy) on every held-out example; the final weights kept on the run."""
    import tensorflow as tf

    weights = run.weights()
    data = run.model.data
    state = worker_state(run)
    with tf.device(_CPU):
        w = [tf.constant(a) for a in weights]
        st = None if state is None else [tf.constant(a) for a in state]
        x, y = tf.constant(data.x_test), tf.constant(data.y_test)
        run.history.final_loss = float(run.model.loss(w, x, y, state=st))
        if run.model.classifier:
            run.history.final_accuracy = float(run.model.accuracy(w, x, y, state=st))
    run.final_weights = weights
    run.final_state = state  # the first running worker's non-trainable values (None: none)


__all__ = ["PROBE_EXAMPLES", "evaluate", "probe", "worker_state"]
