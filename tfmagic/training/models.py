"""Models the training engine can train: built-in ones and any Keras model.

A model here is what the engine needs and nothing more: initial weights, a
loss computed from the weights and a batch, and data already split into
train and held-out parts.  Built-in:

* ``"linear"``: the seeds' y = 2x + 10 (one weight, one bias);
* ``"digits"``: a small MLP (64-32-10) on the UCI handwritten digits
  (1,797 8x8 images that ship inside tfmagic, ``data/digits.npz``: no download);
* any Keras model, given as a function that builds it plus arrays or a
  ``tf.data`` input function (see :class:`KerasModel`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import BadArgument, WrongType


@dataclass
class Data:
    x: np.ndarray
    y: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    def shard(self, index: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Worker ``index`` of ``count`` trains on every ``count``-th example."""
        return self.x[index::count], self.y[index::count]


class Model:
    """Weights as a list of arrays, a loss over (weights, x, y), and the data."""

    name = "model"
    classifier = False
    #: what the engine's final loss is measured on (History.final_loss_label)
    eval_label = "held-out loss"

    def __init__(self, data: Data):
        self.data = data

    def initial_weights(self, seed: int) -> list[np.ndarray]:  # pragma: no cover - interface
        raise NotImplementedError

    def weight_names(self) -> list[str]:
        """Names of the weights, in order (the placement map shows them)."""
        return [f"w{i}" for i in range(len(self.initial_weights(0)))]

    def loss(self, weights, x, y, training: bool = False, state=None):  # pragma: no cover - interface
        """Scalar mean loss; ``weights`` are tf.Variables (or tensors) in order.

        ``training`` is True inside a training step and False for the held-out
        loss (dropout and batch normalization behave differently).  ``state``
        holds the model's non-trainable values (see :meth:`initial_state`):
        variables on the worker in a training step, which the step updates,
        tensors for the held-out loss.
        """
        raise NotImplementedError

    def predict(self, weights, x, training: bool = False, state=None):  # pragma: no cover - interface
        raise NotImplementedError

    def input_dataset(self, index: int, count: int):
        """A function building worker ``index`` of ``count``'s ``tf.data.Dataset``, or None.

        None (the built-in models, and Keras models given arrays): the engine
        copies ``data.shard(index, count)`` into the worker's memory once and
        takes batches from it there.  A function: the engine traces it here
        and runs it on the worker, so the input pipeline (files, maps,
        shuffles) runs in the worker's process and only the graph is sent.
        """
        return None

    def initial_state(self) -> list[np.ndarray]:
        """Non-trainable values (batch-norm statistics, dropout seeds); none for the built-in models.

        They are not averaged on the ps: each worker keeps and updates its own
        copy, and the held-out loss uses the first running worker's (worker 0
        unless it was lost).
        """
        return []

    def accuracy(self, weights, x, y, state=None):
        import tensorflow as tf

        pred = tf.argmax(self.predict(weights, x, state=state), axis=-1, output_type=tf.int32)
        return tf.reduce_mean(tf.cast(tf.equal(pred, tf.cast(y, tf.int32)), tf.float32))


class Linear(Model):
    """The seeds' y = 2x + 10: learn w and b from noisy samples."""

    name = "linear"

    def __init__(self, n: int = 1024, noise: float = 0.1, seed: int = 0):
        rng = np.random.default_rng(seed)
        x = rng.uniform(-1, 1, size=(n + 256, 1)).astype(np.float32)
        y = (2.0 * x + 10.0 + rng.normal(0, noise, size=x.shape)).astype(np.float32)
        super().__init__(Data(x[:n], y[:n], x[n:], y[n:]))

    def initial_weights(self, seed: int) -> list[np.ndarray]:
        return [np.zeros((1, 1), np.float32), np.zeros((1,), np.float32)]

    def weight_names(self) -> list[str]:
        return ["w", "b"]

    def predict(self, weights, x, training: bool = False, state=None):
        import tensorflow as tf

        w, b = weights
        return tf.matmul(x, w) + b

    def loss(self, weights, x, y, training: bool = False, state=None):
        import tensorflow as tf

        return tf.reduce_mean(tf.square(self.predict(weights, x) - y))


class Digits(Model):
    """A 64-``hidden``-10 MLP on the UCI handwritten digits (``data/digits.npz``, shipped with tfmagic).

    The same 1,797 images as scikit-learn's ``load_digits``; tfmagic carries them itself so that it
    does not install scikit-learn, which every ``import tensorflow`` would then import too (Keras'
    wrappers look for it).
    """

    name = "digits"
    classifier = True

    def __init__(self, hidden: int = 32, seed: int = 0):
        with np.load(Path(__file__).with_name("data") / "digits.npz") as d:
            x = (d["images"] / 16.0).astype(np.float32)
            y = d["labels"].astype(np.int32)
        order = np.random.default_rng(seed).permutation(len(x))
        x, y = x[order], y[order]
        cut = int(len(x) * 0.8)
        self.hidden = hidden
        super().__init__(Data(x[:cut], y[:cut], x[cut:], y[cut:]))

    def initial_weights(self, seed: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)

        def glorot(a, b):
            lim = np.sqrt(6.0 / (a + b))
            return rng.uniform(-lim, lim, size=(a, b)).astype(np.float32)

        return [
            glorot(64, self.hidden),
            np.zeros(self.hidden, np.float32),
            glorot(self.hidden, 10),
            np.zeros(10, np.float32),
        ]

    def weight_names(self) -> list[str]:
        return ["hidden/kernel", "hidden/bias", "output/kernel", "output/bias"]

    def predict(self, weights, x, training: bool = False, state=None):
        import tensorflow as tf

        w1, b1, w2, b2 = weights
        return tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2

    def loss(self, weights, x, y, training: bool = False, state=None):
        import tensorflow as tf

        logits = self.predict(weights, x)
        return tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(y, tf.int32), logits=logits)
        )


class KerasModel(Model):
    """Any Keras model: ``build`` returns it; data as arrays or a tf.data input function.

    With arrays (``x=``, ``y=``), ``test_fraction`` of them is held out and
    each worker gets every ``workers``-th remaining example, copied once into
    its memory.

    With ``input_fn(shard_index, num_shards)`` returning a ``tf.data.Dataset``
    of unbatched ``(x, y)`` examples for that shard, the function runs **on
    each worker** (traced here, executed in the worker's process: files it
    reads must exist on the worker's host).  The engine repeats the shard and
    batches it; shuffling is the input function's choice.  Python code inside
    it (``from_generator``, ``tf.py_function``) still runs in this process,
    as TensorFlow places it.  The held-out loss is measured here on
    ``eval_fn()``'s first ``eval_examples`` examples; without ``eval_fn``, on
    the first ``eval_examples`` of ``input_fn(0, 1)``, which are also trained
    on (the history says so).

    Weights are the model's trainable variables, in order; the engine places
    copies on the ps tasks and applies its own optimizer, so the model's
    ``compile`` settings are not used.

    >>> KerasModel(lambda: keras.Sequential([...]), x=x, y=y, loss="mse")   # doctest: +SKIP
    """

    name = "keras"

    def __init__(
        self,
        build: Callable,
        *,
        x=None,
        y=None,
        input_fn: Callable | None = None,
        eval_fn: Callable | None = None,
        eval_examples: int = 2048,
        loss: str | Callable = "sparse_categorical_crossentropy",
        test_fraction: float = 0.2,
        classifier: bool | None = None,
        seed: int = 0,
    ):
        self.input_fn = input_fn
        if input_fn is not None:
            if x is not None or y is not None:
                raise BadArgument("KerasModel takes x and y arrays or an input_fn, not both")
            if not callable(input_fn):
                raise BadArgument("input_fn must be a function (shard_index, num_shards) -> tf.data.Dataset")
            source = eval_fn() if eval_fn is not None else input_fn(0, 1)
            xt, yt = _examples(
                source, eval_examples, "eval_fn()" if eval_fn is not None else "input_fn(0, 1)"
            )
            if eval_fn is None:
                self.eval_label = f"loss on the first {len(xt)} training examples (no eval_fn)"
            data = Data(xt[:0], yt[:0], xt, yt)
        else:
            if x is None or y is None:
                raise BadArgument(
                    "KerasModel needs x and y arrays or an input_fn returning a tf.data.Dataset"
                )
            x, y = np.asarray(x, np.float32), np.asarray(y)
            order = np.random.default_rng(seed).permutation(len(x))
            x, y = x[order], y[order]
            cut = int(len(x) * (1 - test_fraction))
            data = Data(x[:cut], y[:cut], x[cut:], y[cut:])
        super().__init__(data)
        self._build = build
        self._loss = loss
        self.keras_model = build()
        if not self.keras_model.built:
            self.keras_model.build((None,) + tuple(data.x_test.shape[1:]))
        self._state0 = [np.asarray(v.numpy()) for v in self.keras_model.non_trainable_variables]
        self.classifier = (
            classifier
            if classifier is not None
            else loss
            in (
                "sparse_categorical_crossentropy",
                "categorical_crossentropy",
            )
        )

    def input_dataset(self, index: int, count: int):
        if self.input_fn is None:
            return None
        input_fn = self.input_fn
        return lambda: input_fn(index, count)

    def initial_weights(self, seed: int) -> list[np.ndarray]:
        return [np.asarray(v.numpy()) for v in self.keras_model.trainable_variables]

    def weight_names(self) -> list[str]:
        return [getattr(v, "path", None) or v.name for v in self.keras_model.trainable_variables]

    def _loss_fn(self):
        import keras

        return keras.losses.get(self._loss) if isinstance(self._loss, str) else self._loss

    def initial_state(self) -> list[np.ndarray]:
        return [np.asarray(a) for a in self._state0]

    def predict(self, weights, x, training: bool = False, state=None):
        model = self.keras_model
        # Run the Keras graph with the engine's (remote) weights in place of its own, and the
        # non-trainable values the engine keeps (never the model's own variables: they belong to
        # the connection they were made under).  training=False for the held-out loss.
        import tensorflow as tf

        values = [tf.convert_to_tensor(v) for v in (self._state0 if state is None else state)]
        out, new_state = model.stateless_call(list(weights), values, x, training=training)
        if training and state is not None:
            for var, value in zip(state, new_state):
                if hasattr(var, "assign"):  # a worker's copy: dropout seeds advance, statistics move
                    var.assign(value)
        return out

    def loss(self, weights, x, y, training: bool = False, state=None):
        import tensorflow as tf

        out = self.predict(weights, x, training=training, state=state)
        return tf.reduce_mean(self._loss_fn()(y, out))


def _examples(dataset, limit: int, what: str) -> tuple[np.ndarray, np.ndarray]:
    """The first ``limit`` (x, y) examples of ``dataset`` as two arrays (read in this process)."""
    import tensorflow as tf

    if not isinstance(dataset, tf.data.Dataset):
        raise BadArgument(
            f"{what} must return a tf.data.Dataset of (x, y) examples, not {type(dataset).__name__}"
        )
    spec = dataset.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2):
        raise BadArgument(f"{what} must return a Dataset of (x, y) pairs; its elements are {spec}")
    xs, ys = [], []
    for ex_x, ex_y in dataset.take(limit):
        xs.append(np.asarray(ex_x))
        ys.append(np.asarray(ex_y))
    if not xs:
        raise BadArgument(f"{what} returned an empty Dataset; the held-out loss needs examples")
    return np.stack(xs), np.stack(ys)


BUILTIN = {"linear": Linear, "digits": Digits}


def resolve(model, **kwargs) -> Model:
    """A :class:`Model` from a name, an instance or a Keras-model builder."""
    if isinstance(model, Model):
        return model
    if isinstance(model, str):
        if model not in BUILTIN:
            raise BadArgument(
                f"unknown model {model!r}; use one of {', '.join(BUILTIN)} or a KerasModel(...)"
            )
        return BUILTIN[model](**kwargs)
    raise WrongType(
        f"model must be 'linear', 'digits' or a tfmagic.KerasModel, not {type(model).__name__}; "
        "wrap a Keras model as KerasModel(build_fn, x=..., y=...)"
    )
