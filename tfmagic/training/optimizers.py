"""Optimizers that update variables where they live (on the ps tasks).

Written out by hand instead of Keras optimizers so that each update is a
few ops colocated with its variable, the same inside a sync aggregation and
an async worker step, and so that slot variables (momentum, Adagrad's
accumulator) are created beside their weights on the same ps.  Dean et al.
(Downpour SGD) found Adagrad steadies asynchronous training.
"""

from __future__ import annotations

NAMES = ("sgd", "momentum", "adagrad")


class Optimizer:
    def __init__(
        self, name: str = "sgd", lr: float = 0.1, momentum: float = 0.9, initial_accumulator: float = 0.1
    ):
        if name not in NAMES:
            raise ValueError(f"unknown optimizer {name!r}; use one of {', '.join(NAMES)}")
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

    def apply(self, grads, variables) -> list:
        """Update ``variables`` in place (inside a tf.function); returns the update ops."""
        import tensorflow as tf

        lr = tf.constant(self.lr)
        updates = []
        for i, (g, v) in enumerate(zip(grads, variables)):
            if self.name == "sgd":
                updates.append(v.assign_sub(lr * g))
            elif self.name == "momentum":
                m = self.slots[i]
                new_m = m.assign(self.momentum * m + g)
                updates.append(v.assign_sub(lr * new_m))
            else:
                acc = self.slots[i]
                new_acc = acc.assign_add(g * g)
                updates.append(v.assign_sub(lr * g / tf.sqrt(new_acc)))
        return updates

    def state(self) -> list:
        return [s.numpy() for s in self.slots]

    def load_state(self, values) -> None:
        for s, val in zip(self.slots, values):
            s.assign(val)
