"""Optimizers that update variables where they live (on the ps tasks).

Written out by hand instead of Keras optimizers so that each update is a
few ops colocated with its variable, the same inside a sync aggregation and
an async worker step, and so that slot variables (momentum, Adagrad's
accumulator) are created beside their weights on the same ps.  Dean et al.
(Downpour SGD) found Adagrad steadies asynchronous training.
"""

from __future__ import annotations

from ..errors import BadArgument

NAMES = ("sgd", "momentum", "adagrad")


class Optimizer:
    def __init__(
        self, name: str = "sgd", lr: float = 0.1, momentum: float = 0.9, initial_accumulator: float = 0.1
    ):
        if name not in NAMES:
            raise BadArgument(f"unknown optimizer {name!r}; use one of {', '.join(NAMES)}")
        self.name = name
        self.lr = float(lr)
        self.momentum = float(momentum)
        self.initial_accumulator = float(initial_accumulator)
        self.slots: list = []

    def create_slots(self, variables) -> None:
        """Slot variables on the same device as each weight."""
        import tensorflow as tf

        self.slots = []
        if self.name == "sgd":
            return
        for v in variables:
            with tf.device(v.device):
                init = self.initial_accumulator if self.name == "adagrad" else 0.0
                self.slots.append(tf.Variable(tf.fill(v.shape, init), trainable=False))

    def apply(self, grads, variables, active=None) -> list:
        """Update ``variables`` in place (inside a tf.function); returns the update ops.

        ``active`` (a boolean scalar tensor) turns the update into an exact
        no-op when false, without control flow: an async step that came
        after the last update still runs its ops but changes nothing.
        """
        import tensorflow as tf

        lr = tf.constant(self.lr)
        updates = []
        for i, (g, v) in enumerate(zip(grads, variables)):
            on = None if active is None else tf.cast(active, g.dtype)
            if self.name == "sgd":
                step = lr * g
                updates.append(v.assign_sub(step if on is None else step * on))
            elif self.name == "momentum":
                m = self.slots[i]
                new_m = self.momentum * m + g
                new_m = m.assign(new_m if active is None else tf.where(active, new_m, m))
                step = lr * new_m
                updates.append(v.assign_sub(step if on is None else step * on))
            else:
                acc = self.slots[i]
                g2 = g * g
                new_acc = acc.assign_add(g2 if on is None else g2 * on)
                step = lr * g / tf.sqrt(new_acc)
                updates.append(v.assign_sub(step if on is None else step * on))
        return updates

    def state(self) -> list:
        return [s.numpy() for s in self.slots]

    def load_state(self, values) -> None:
        for s, val in zip(self.slots, values):
            s.assign(val)
