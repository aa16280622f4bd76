"""What the loops and the failure policy may ask of the run they serve.

A loop is one algorithm on one screen (sync: wait for enough gradients, average,
apply; async: every worker steps on its own), and the failure policy says what a
lost, stopped or joining worker means for it.  Neither needs the whole
:class:`~tfmagic.training.run.TrainingRun`, which also owns its thread, its
schedule, its TensorBoard writer, its dashboard and the workers' notes.  These
two protocols name what each side reads, and ``tests/test_architecture.py``
checks that the loops and the policy read nothing else of the run: a new loop
(or a run whose workers share processes) then knows the few things it must
provide, and a change to the run's other parts cannot reach inside a loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..metrics import History
    from .checkpoints import Checkpoints
    from .config import RunConfig
    from .control import Control
    from .failures import FailurePolicy
    from .models import Model
    from .params import ParameterStore
    from .steps import Worker


class LoopContext(Protocol):
    """What a loop (``SyncLoop``, ``FusedSyncLoop``, ``AsyncLoop``) reads of its run."""

    #: the run's name, and who it is to the client's gate and the hang doctor
    name: str
    who: str
    #: "sync", "async" or "ssp"
    mode: str
    #: the cluster the run trains on (its procs, its pace)
    cluster: Any
    config: RunConfig
    model: Model
    #: the run's parts, shared with the policy: when to stop, what was recorded, the variables on the ps
    control: Control
    history: History
    params: ParameterStore
    policy: FailurePolicy

    @property
    def start_step(self) -> int:
        """The global step the run started from (a resumed run: its checkpoint's)."""

    def step_now(self) -> int:
        """The latest global step the run knows of."""

    def place(self, w: Worker) -> None:
        """Trace ``w``'s step functions on its task (a worker joining, or one restarted)."""

    def checkpoint(self, force: bool = False) -> None:
        """Save the weights when a checkpoint is due."""


class PolicyContext(Protocol):
    """What the failure policy reads of its run (its parts come to it as arguments)."""

    name: str
    who: str
    mode: str
    #: how the engine runs the steps: "fused", "sync", "paced" or "async"
    kind: str
    cluster: Any
    config: RunConfig
    model: Model
    checkpoints: Checkpoints
    #: the workers the run counts: the policy widens it when a worker with a higher index joins
    workers_n: int

    def step_now(self) -> int:
        """The latest global step the run knows of."""

    def place(self, w: Worker) -> None:
        """Trace ``w``'s step functions on its task."""

    def layout(self) -> list[tuple]:
        """Where each variable lives now (the history's record of it)."""
