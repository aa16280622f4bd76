"""Launchers whose tasks a scheduler starts, each behind a relay that dials back to this process.

Spark (:mod:`tfmagic.launchers.spark`) and Slurm (:mod:`tfmagic.launchers.slurm`) both run a small
relay program (:mod:`tfmagic.launchers.spark_task`) wherever they place a task: it connects back
to an authenticated listener here (:class:`~tfmagic.launchers.spark.relay.Relay`), claims its slot
of a job (:class:`~tfmagic.launchers.spark.jobs.Jobs`), starts the task process as its child and
carries its channel and its log.  What differs is how a job is submitted and cancelled; what a
task is once its relay has connected is the same, and lives here: the
:class:`~tfmagic.launchers.channel.TaskProcess` over the relayed connection, ending a task, waiting
for its end, the refusals, and what to say when a scheduler's Python lacks tfmagic or TensorFlow.
"""

from __future__ import annotations

import itertools
import socket
from typing import IO, TYPE_CHECKING, Any, cast

from ..errors import ClusterStartError
from ..procs import owner
from ..protocol import Op
from .base import Launcher
from .channel import TaskProcess
from .process import PACKAGE_PARENT, TASK_ENV

if TYPE_CHECKING:  # the Spark package's launcher is built on this module
    from .spark.jobs import Batch, Jobs, Slot
    from .spark.relay import Refusal, Relay

_fake_pids = itertools.count(-1, -1)


class EndOnReset:
    """The reading end of a relayed control connection: a reset (a relay killed with bytes
    unread, as Spark does to a cancelled job and Slurm to a cancelled step) is the end of the
    stream, as a closed pipe is for a local task, not an exception that ends the task's reader
    thread unrecorded."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream

    def readline(self, size: int = -1) -> bytes:
        try:
            return self._stream.readline(size)
        except OSError:
            return b""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class RelayedLauncher(Launcher):
    """The launcher contract for tasks behind relays; subclasses submit and cancel the jobs."""

    python: str
    jobs: Jobs
    relay: Relay
    #: what the scheduler calls the place a task runs, for messages ("Spark executor host")
    where_tasks_run = "host"

    guard: bool
    loopback: bool
    extra_env: dict[str, str | None]

    def cancel(self, batch: Batch) -> None:
        """Cancel ``batch``'s job with the scheduler (its relays, and so its tasks, end)."""

    @property
    def where_key(self) -> Any:
        """What names where this launcher's jobs go (Spark's master, Slurm's partition)."""
        return None

    def relay_host(self) -> str | None:
        """The address the tasks' relays dial back to: they reach this machine there."""
        return self.host

    def running_as(self) -> str:
        """How the tasks run, for the security line ("Spark tasks (local[3])", "Slurm job(s) 12")."""
        return f"{self.name} tasks"

    # -- placement: the scheduler places the tasks; each one's address is known when its relay dials back
    @property
    def signature(self) -> tuple:
        return (self.name, self.where_key, self.python)

    def placement(self) -> tuple:
        return (self.name, self.where_key)

    def hosts_for(self, count: int) -> list[str]:
        return [self.name] * count

    def relay_config(self, batch: Batch, host: str, port: int) -> dict[str, Any]:
        """What each relay of ``batch`` is told, never on a command line: where to dial back, the
        cluster's secret, and the task's Python and environment."""
        env: dict[str, str | None] = dict(TASK_ENV)
        env.update(self.extra_env)
        return {
            "host": host,
            "port": port,
            "secret": self.relay.secret.hex(),
            "batch": batch.id,
            "python": self.python,
            "env": env,
            "guard": self.guard,
            # A checkout that is not installed still works when the tasks share this machine.
            "pythonpath": PACKAGE_PARENT if self.loopback else None,
        }

    def security_note(self) -> str:
        where = "their spec address only" if self.guard else "EVERY network interface"
        return (
            f"tasks run as {self.running_as()}; their control channel to this process is authenticated "
            f"with a per-cluster secret ({self.relay.refusals_note()}) but not encrypted; task servers "
            f"listen on {where} and run any TensorFlow graph anyone who can reach them sends"
        )

    # -- the parts, by the names tests and older code use ---------------------------------
    @property
    def _batches(self) -> dict[str, Batch]:
        return self.jobs.batches

    @property
    def _by_pid(self) -> dict[int, Slot]:
        return self.jobs.by_pid

    @property
    def _secret(self) -> bytes:
        return self.relay.secret

    @property
    def _listener(self) -> socket.socket | None:
        return self.relay.sock

    @property
    def refused(self) -> list[Refusal]:
        """The last connections refused, ``(time, peer, reason)``, newest last (see ``refused_count``)."""
        return list(self.relay.refused)

    @property
    def refused_count(self) -> int:
        """Every connection refused so far."""
        return self.relay.refused_count

    # -- a task behind its relay ----------------------------------------------------------
    def _process(self, slot: Slot) -> TaskProcess:
        taken = {p.pid for p in owner.processes()}
        pid = self.jobs.adopt(slot, taken, lambda: next(_fake_pids))
        assert slot.control is not None
        proc = TaskProcess(
            launcher=self,
            pid=pid,
            host=slot.address or "127.0.0.1",
            to_task=slot.control.makefile("wb"),
            from_task=cast(IO[bytes], EndOnReset(slot.control.makefile("rb"))),
            log_path=slot.log_path,
        )
        proc.destination = slot.address
        return proc

    def _restarted(self, batch: Batch, host: str | None, what_to_do: str) -> TaskProcess:
        """The task of a restart's one-task ``batch``, which must be where the old one was
        (``host``: the rest of the cluster knows it by that address); else the job is cancelled and
        the error says where it went, then ``what_to_do``."""
        slot = batch.slots[0]
        if host and host != self.name and slot.address and slot.address != host:
            self.jobs.abandon(batch, self.cancel)
            raise ClusterStartError(
                f"{self.name.capitalize()} placed the restarted task on {slot.address}, not on {host} where "
                f"the rest of the cluster expects it{what_to_do}"
            )
        return self._process(slot)

    def kill(self, proc: TaskProcess) -> None:
        """Ask the task to end at once (it kills its own group), then end its connection."""
        slot = self.jobs.get(proc.pid)
        if slot is None or slot.done.is_set():
            return
        proc.send(Op.CRASH)
        if not slot.done.wait(3):
            # The task did not answer (stopped by a throttle? a stuck relay?): closing the
            # control connection ends its standard input, and the relay ends the task if it
            # does not end by itself.
            if slot.control is not None:
                try:
                    slot.control.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            if not slot.done.wait(10):
                slot.close()

    def wait_exit(self, proc: TaskProcess) -> int | None:
        slot = self.jobs.get(proc.pid)
        if slot is None:
            return None
        if not slot.done.wait(15):
            slot.close()
        slot.done.wait(5)
        slot.close()
        self.jobs.forget(proc.pid)
        return slot.exit_code

    def diagnose(self, proc: TaskProcess, log_tail: str) -> str:
        slot = self.jobs.get(proc.pid)
        where = (
            f"{slot.hostname} ({slot.address})" if slot and slot.hostname else f"the {self.where_tasks_run}s"
        )
        if "No module named 'tfmagic" in log_tail:
            return (
                f"install tfmagic and TensorFlow for {self.python} on every {self.where_tasks_run} "
                f"({where} here), or pass python= with the Python that has them"
            )
        if "TensorFlow could not be imported" in log_tail or "No module named 'tensorflow" in log_tail:
            return f"install TensorFlow for {self.python} on {where}, or pass python= with the Python that has it"
        if slot is not None and slot.error:
            return slot.error
        return ""
