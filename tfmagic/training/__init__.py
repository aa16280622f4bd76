"""Training on a cluster: ``tfmagic.train`` and ``tfmagic.compare``.

>>> history = tfmagic.train(cluster, mode="sync", model="digits", steps=200)     # doctest: +SKIP
>>> run = tfmagic.train(cluster, mode="async", steps=500, block=False)            # doctest: +SKIP
>>> run.history.throughput(); run.wait()                                          # doctest: +SKIP
"""

from __future__ import annotations

import threading

from .. import events
from ..errors import TrainingError
from ..metrics import History
from .config import MODES, RunConfig
from .models import Digits, KerasModel, Linear, Model
from .run import TrainingRun

__all__ = [
    "MODES",
    "last_run",
    "RunConfig",
    "Comparison",
    "Digits",
    "KerasModel",
    "Linear",
    "Model",
    "TrainingError",
    "TrainingRun",
    "compare",
    "train",
]


def last_run():
    """The run, comparison or ``%%tf_px`` cell started last in this process, or None."""
    return next(iter(events.started), None)


def train(cluster, mode: str = "sync", *, block: bool = True, **kwargs) -> History | TrainingRun:
    """Train on ``cluster``; returns the :class:`~tfmagic.metrics.History`.

    With ``block=False`` it trains in a background thread and returns the
    :class:`TrainingRun` at once (``.wait()``, ``.stop()``, live ``.history``).
    Keyword arguments: ``model`` ("linear", "digits" or a ``KerasModel``),
    ``steps``, ``lr``, ``batch_size`` (per worker step: one number, or each worker's,
    ``{"worker:0": 64, "worker:1": 16}``, which sync averages weighted by examples), ``backup_workers`` (sync),
    ``optimizer`` ("sgd", "momentum", "adagrad"), ``seed``, ``logdir``
    (TensorBoard), ``checkpoint_every``, ``name``.
    """
    run = TrainingRun(cluster, mode, **kwargs).start()
    if not block:
        return run
    try:
        return run.wait()
    except KeyboardInterrupt:
        run.stop()
        raise


class Comparison:
    """Several runs of the same model from the same initial weights and data, one after another."""

    def __init__(self, cluster, modes=("sync", "async"), **kwargs) -> None:
        for m in modes:
            if m not in MODES:
                raise TrainingError(f"mode must be one of {', '.join(MODES)}, not {m!r}")
        model = kwargs.pop("model", "linear")
        from .models import resolve

        try:
            model = resolve(model)
        except (ValueError, TypeError) as exc:
            raise TrainingError(str(exc)) from None
        self.runs: list[TrainingRun] = []
        for m in modes:
            opts = dict(kwargs)
            if m != "sync":
                opts.pop("backup_workers", None)
                opts.pop("late", None)
            if m != "ssp":
                opts.pop("staleness", None)
            self.runs.append(TrainingRun(cluster, m, model=model, name=m, **opts))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.current: TrainingRun | None = None

    @property
    def histories(self) -> list[History]:
        return [r.history for r in self.runs]

    def start(self) -> Comparison:
        from .run import refuse_if_training

        refuse_if_training(self.runs[0].cluster)  # here, in the caller: not later in its thread

        def go():
            for run in self.runs:
                if self._stop.is_set() or not run.cluster.running:
                    break
                self.current = run
                run.start()
                events.started.publish(self)
                run.wait(raise_error=False)
            self.current = None

        self._thread = threading.Thread(target=go, name="tfmagic-compare", daemon=True)
        self._thread.start()
        events.started.publish(self)
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> list[History]:
        if self._thread is not None:
            self._thread.join(timeout)
        return self.histories

    def stop(self) -> list[History]:
        self._stop.set()
        if self.current is not None:
            self.current.stop()  # returns within two seconds, whatever the tasks do
        return self.wait(1.0)

    def __repr__(self) -> str:
        state = "training " + self.current.name if self.current is not None else "done"
        return f"<Comparison {' vs '.join(r.name for r in self.runs)}: {state}>\n{self.table()}"

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(repr(self))

    def table(self) -> str:
        """Side by side: updates, examples consumed, warm-up, seconds, rates, held-out loss, accuracy."""
        from ..metrics import comparison_table

        return comparison_table(self.histories)


def compare(cluster, modes=("sync", "async"), *, block: bool = True, **kwargs) -> Comparison:
    """Run ``modes`` one after another from the same initial weights and data."""
    comp = Comparison(cluster, modes, **kwargs).start()
    if block:
        comp.wait()
    return comp
