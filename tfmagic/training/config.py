"""A training run's settings, checked once, before anything runs."""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import TrainingError
from ..spec import TaskName
from .optimizers import NAMES as OPTIMIZERS

MODES = ("sync", "async", "ssp")


def _whole(label: str, value, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise TrainingError(f"{label} must be a whole number >= {lo}, not {value!r}")
    return value


@dataclass(frozen=True)
class RunConfig:
    """What a run was asked to do: ``RunConfig.checked(mode="sync", steps=300, ...)``.

    Every field is validated in :meth:`checked` with a message that says what
    to give instead; the engine's parts read it and never re-check.
    """

    mode: str = "sync"
    steps: int = 200
    lr: float = 0.1
    batch_size: int = 32
    backup_workers: int = 0
    optimizer: str = "sgd"
    seed: int = 0
    logdir: Path | None = None
    checkpoint_every: int = 50
    checkpoint_dir: Path | None = None
    name: str = ""
    #: ssp: how many steps a worker may run ahead of the slowest (sync is 0, async unbounded)
    staleness: int | None = None
    #: async: updates made per call to a worker (Keras' steps_per_execution); every one recorded
    steps_per_call: int = 1
    #: workers given their own batch size, (task, size); the others take ``batch_size``
    worker_batches: tuple[tuple[str, int], ...] = ()
    #: sync with backup workers: what a worker still computing when the update is made does.
    #: "finish": its step runs to the end and the gradient is dropped (SyncReplicasOptimizer, Chen et
    #: al.); "cancel": its step stops there and it starts the next one from the new parameters (K-sync
    #: SGD, Dutta et al. 2018, whose step-time formulas assume it). Only a modelled machine can be
    #: stopped mid-step, so "cancel" needs a paced cluster.
    late: str = "finish"

    def batch_of(self, task) -> int:
        """The examples per step of worker ``task``."""
        return dict(self.worker_batches).get(str(task), self.batch_size)

    def weight_of(self, task) -> float:
        """Worker ``task``'s weight in sync's average: its batch size when workers were given their
        own (the average is then over examples), else 1 (every worker's gradient counts the same)."""
        return float(self.batch_of(task)) if self.weighted else 1.0

    @property
    def weighted(self) -> bool:
        """Whether workers were given their own batch sizes, so sync weights each gradient by its examples."""
        return bool(self.worker_batches)

    @property
    def batch_label(self):
        """``batch_size`` as given: one number, or each worker's."""
        return dict(self.worker_batches) if self.worker_batches else self.batch_size

    @classmethod
    def checked(cls, workers: int, **kwargs) -> RunConfig:
        """A config for a cluster with ``workers`` workers, or a :class:`TrainingError` saying what is wrong."""
        known = {f for f in cls.__dataclass_fields__} | {"mode"}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TrainingError(f"unknown option {unknown[0]!r}; the options are {', '.join(sorted(known))}")
        mode = kwargs.get("mode", "sync")
        if mode not in MODES:
            raise TrainingError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        steps = _whole("steps", kwargs.get("steps", 200), 1)
        batch, worker_batches = _batches(kwargs.get("batch_size", 32), workers)
        backup = _whole("backup_workers", kwargs.get("backup_workers", 0), 0)
        if backup >= workers:
            raise TrainingError(
                f"backup_workers={backup} leaves no gradient to aggregate with {workers} workers; "
                f"use at most {workers - 1}"
            )
        if backup and mode != "sync":
            raise TrainingError(
                f"backup_workers only makes sense for mode='sync' ({mode} never waits for all)"
            )
        staleness = kwargs.get("staleness")
        if mode == "ssp":
            if staleness is None:
                raise TrainingError(
                    "mode='ssp' needs staleness=S: how many steps a worker may run ahead of the slowest"
                )
            staleness = _whole("staleness", staleness, 0)
        elif staleness is not None:
            raise TrainingError(f"staleness is for mode='ssp' (stale synchronous parallel), not {mode!r}")
        late = kwargs.get("late", "finish")
        if late not in ("finish", "cancel"):
            raise TrainingError(f"late must be 'finish' or 'cancel', not {late!r}")
        if late == "cancel" and not backup:
            raise TrainingError(
                "late='cancel' is for sync with backup_workers (it stops the steps an update no longer "
                "waits for); without backups every update waits for every worker"
            )
        per_call = _whole("steps_per_call", kwargs.get("steps_per_call", 1), 1)
        if per_call > 1 and (mode == "ssp" or backup):
            raise TrainingError(
                "steps_per_call is for async, and for sync without backup workers: ssp and backup workers "
                "decide between steps"
            )
        lr = kwargs.get("lr", 0.1)
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (lr > 0 and math.isfinite(lr)):
            raise TrainingError(f"lr must be a finite number > 0, not {lr!r}; for example lr=0.1")
        optimizer = kwargs.get("optimizer", "sgd")
        if optimizer not in OPTIMIZERS:
            raise TrainingError(f"unknown optimizer {optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
        seed = _whole("seed", kwargs.get("seed", 0), 0)
        logdir = kwargs.get("logdir")
        if logdir is not None:
            logdir = Path(logdir)
            if logdir.exists() and not logdir.is_dir():
                raise TrainingError(
                    f"logdir {str(logdir)!r} is a file; give a directory (it is made if missing)"
                )
        every = _whole("checkpoint_every", int(kwargs.get("checkpoint_every", 50)), 1)
        ckpt = kwargs.get("checkpoint_dir")
        if ckpt is None:
            from ..procs import owner

            ckpt = tempfile.mkdtemp(prefix="checkpoints-", dir=owner.runtime_dir())
        return cls(
            mode=mode,
            steps=steps,
            lr=float(lr),
            batch_size=batch,
            backup_workers=backup,
            optimizer=optimizer,
            seed=seed,
            logdir=logdir,
            checkpoint_every=every,
            checkpoint_dir=Path(os.fspath(ckpt)),
            name=kwargs.get("name") or mode,
            staleness=staleness,
            steps_per_call=per_call,
            worker_batches=worker_batches,
            late=late,
        )


def _batches(value, workers: int) -> tuple[int, tuple[tuple[str, int], ...]]:
    """``batch_size`` read: one size for every worker, or ``{"worker:0": 64, "worker:1": 16}``.

    Seed 002 gives each worker its own batch (a faster machine takes more examples per step);
    workers not named, and workers that join during the run, take the default of 32.
    """
    if not isinstance(value, dict):
        return _whole("batch_size", value, 1), ()
    if not value:
        raise TrainingError("batch_size={} names no worker; give one number, or {'worker:0': 64, ...}")
    sizes: dict[str, int] = {}
    for key, size in value.items():
        try:
            task = TaskName.parse(key)
        except (TypeError, ValueError):
            task = None
        if task is None or task.job != "worker" or task.index >= workers:
            raise TrainingError(
                f"batch_size names {key!r}, which is not a worker of this cluster "
                f"(its workers are worker:0 to worker:{workers - 1})"
            )
        sizes[str(task)] = _whole(f"batch_size[{str(task)!r}]", size, 1)
    return 32, tuple(sorted(sizes.items()))
