"""The exceptions tfmagic raises.

Every message says what happened, shows the evidence (task, pid, port, the
last lines of its log) and what to do next, because the person reading it is
usually in the middle of a notebook and cannot go digging for a log file.
The magics turn these into one red line; scripts get an ordinary exception.
"""

from __future__ import annotations


class TfmagicError(Exception):
    """Base class of every error tfmagic raises on purpose."""


class BadTaskName(TfmagicError, ValueError):
    """A task name that is not ``job:index`` or ``/job:NAME/task:INDEX``."""


class UnknownTask(TfmagicError, KeyError):
    """A well-formed task name that the cluster does not have."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class BadClusterShape(TfmagicError, ValueError):
    """Counts of ps/workers that cannot make a cluster."""


class BadNet(TfmagicError, ValueError):
    """A rate, delay or task for the modelled network (tfmagic.network.shaper) that cannot be used."""


class NoCluster(TfmagicError):
    """An action needs a running cluster and there is none."""


class ClusterRunning(TfmagicError):
    """A start was asked for while a cluster of another shape or placement runs."""

    def __init__(self, message: str, running=None, what: str = "shape"):
        super().__init__(message)
        self.running = running
        self.what = what


class ClusterStartError(TfmagicError):
    """A task did not come up; carries the task and the tail of its log."""

    def __init__(self, message: str, task: str | None = None, log_tail: str = ""):
        super().__init__(message)
        self.task = task
        self.log_tail = log_tail


class WillNotFit(ClusterStartError):
    """The tasks asked for need more memory than this process's limit leaves (see ``tfmagic.procs.memory``)."""


class TaskLost(TfmagicError):
    """A task process ended while something depended on it."""


class ExportError(TfmagicError, ValueError):
    """Options that cannot make a Slurm script or Kubernetes manifests (``tfmagic.export``)."""


class NotOwned(TfmagicError):
    """An action on a task that tfmagic did not start (an attached cluster)."""


class NeedsForce(TfmagicError):
    """An action that would lose work (a running task's state, an existing file) was asked without force."""


class SharedProcess(TfmagicError):
    """What one task cannot do alone because it shares its process with others (``processes=``)."""


class PxError(TfmagicError):
    """A ``%%tf_px`` request that cannot be sent (bad targets, no cluster...)."""


class TrainingError(TfmagicError):
    """Training could not go on; the message says why and what to do."""


class ClientBusy(TfmagicError):
    """The connection cannot change now: remote calls (or an earlier change) still wait on a task."""


class TaskHasNoInput(TfmagicError, RuntimeError):
    """A ``%%tf_px`` cell tried to read input: a task process has no keyboard."""


class ShownAbove(TfmagicError):
    """A cell failed and its own error was already shown above it (a magic then adds one line).

    IPython shows ``_render_traceback_`` instead of a traceback wall.
    """

    def __init__(self, note: str):
        super().__init__(note)
        self.note = note

    def _render_traceback_(self) -> list[str]:
        return [self.note]


class BadExpectation(TfmagicError, ValueError):
    """A lesson's expectation no value could meet, or none given (``tfmagic.lesson``): a mistake in the lesson."""


class LessonCheckFailed(TfmagicError, AssertionError):
    """A lesson's statement that this run contradicted (``tfmagic.lesson``, strict mode only)."""


class BadPace(TfmagicError, ValueError):
    """A pace that is not a positive duration (``"40ms"``), or one the machine cannot keep."""


class BadArgument(TfmagicError, ValueError):
    """A value given to tfmagic's API that it cannot use (a size, a factor, a name); the message says what to give."""


class WrongType(TfmagicError, TypeError):
    """An argument of a kind tfmagic's API does not take; the message names the kinds it does."""


class WaitTimedOut(TfmagicError, TimeoutError):
    """Something tfmagic waited on (a task's answer, a run, a free port) did not come in time."""
