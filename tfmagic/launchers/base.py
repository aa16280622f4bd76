"""The launcher contract: where task processes run, and the handle each one gives back.

A cluster asks a :class:`Launcher` for processes and gets :class:`TaskHandle`
objects back; it never cares where they run.  Local, SSH and Spark launchers
all hand back :class:`~tfmagic.launchers.channel.TaskProcess` (a process that
speaks :mod:`tfmagic.protocol` over a byte channel); an attached cluster
hands back :class:`~tfmagic.attached.AttachedTask` (an address tfmagic did not
start).  What differs between launchers is a few decisions, each one method
with a default that works for any task reached through its channel:

* :meth:`Launcher.pick_port`, :meth:`Launcher.stats`: asked of the task
  itself (it knows its host); a local launcher answers faster from here;
* :meth:`Launcher.task_log`: the file a task writes its log to (``None``:
  its standard error comes back to this machine and the launcher writes it).

Only three methods have no default: :meth:`~Launcher.spawn`,
:meth:`~Launcher.kill` and :meth:`~Launcher.wait_exit`.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable
from typing import Any, ClassVar, Protocol, runtime_checkable

from ..events import Topic
from ..logs import read_tail
from ..protocol import Op
from ..spec import ClusterDef, TaskName


class TaskState(str, enum.Enum):
    """Life of a task process, as the owner sees it."""

    IMPORTING = "importing"  # started, importing TensorFlow
    SPARE = "spare"  # TensorFlow imported, waiting for a role
    ASSIGNING = "starting"  # role sent, server not up yet
    RUNNING = "running"  # server accepts connections
    FAILED = "failed"  # could not take its role
    EXITED = "exited"  # process ended
    KILLED = "killed"  # a task sharing its process, killed alone as modelled: its server cut off

    def __str__(self) -> str:
        return self.value


@runtime_checkable
class TaskHandle(Protocol):
    """What a cluster needs of one task, wherever and however it runs."""

    task: TaskName | None
    pid: int | None
    task_pid: int | None
    host: str
    destination: str | None
    state: TaskState
    exit_code: int | None
    failure: str | None
    log_path: str
    messages: Topic

    @property
    def alive(self) -> bool: ...

    @property
    def label(self) -> str: ...

    def send(self, op: str, **fields: Any) -> None: ...

    def request(self, op: str, timeout: float = 10.0, **fields: Any) -> dict[str, Any]: ...

    def kill(self) -> None: ...

    def log_tail(self, lines: int = 20) -> str: ...


class Launcher(abc.ABC):
    """How task processes are started, killed and read on one kind of host.

    ``signature`` says which spare processes are interchangeable: a spare made
    by a launcher with another signature (other environment, other host) is
    never given a role here.  ``makes_spares`` says whether warm spare
    processes (see :mod:`tfmagic.pool`) make sense for this launcher.
    """

    name: ClassVar[str] = "base"
    makes_spares: ClassVar[bool] = False
    #: ``progress(task, stage, detail)`` of the start under way (the task set sets it around
    #: :meth:`spawn_many`): where a launcher that waits on a scheduler says why it waits
    progress: Callable[[str, str, str], None] | None = None
    #: the host part of addresses this launcher's tasks serve on (when there is one)
    host: str = "127.0.0.1"

    # -- what every launcher must say --------------------------------------
    @abc.abstractmethod
    def spawn(self, log_path: str, host: str | None = None) -> TaskHandle:
        """Start one task process (warming up, without a role yet) on ``host``."""

    @abc.abstractmethod
    def kill(self, proc: TaskHandle) -> None:
        """End the process and everything it started, now; safe to call twice."""

    @abc.abstractmethod
    def wait_exit(self, proc: TaskHandle) -> int | None:
        """Block until the process has ended; its exit code (``None`` if unknown)."""

    # -- defaults that work for any task reached through its channel ----------
    @property
    def signature(self) -> tuple:
        return (self.name, self.host)

    def placement(self) -> tuple:
        """What a start compares to decide whether a running cluster is the one asked for."""
        return (self.name,)

    def describe(self) -> str:
        """Where the tasks run, for messages: ``""`` (here), ``" over ssh on a,b"``."""
        return ""

    def relay_host(self) -> str | None:
        """The address of this machine that the tasks reach directly, where a modelled network's
        relay (:mod:`tfmagic.network.shaper`) can listen for them; None where they reach it only
        through tunnels (SSH) or not at all (an attached cluster): no modelled network there."""
        return None

    def hosts_for(self, count: int) -> list[str]:
        """Where each of ``count`` tasks goes (the host part of its address)."""
        return [self.host] * count

    def spawn_many(self, log_paths: list[str], hosts: list[str]) -> list[TaskHandle]:
        """Start one process per log path, on the given hosts (Spark starts them as one job)."""
        return [self.spawn(log, host) for log, host in zip(log_paths, hosts, strict=True)]

    def pick_port(self, proc: TaskHandle) -> int:
        """A free port for ``proc``'s server on its host; the task looks there itself."""
        return int(
            proc.request(Op.FREE_PORT, timeout=30.0, host=getattr(proc, "bind_host", None) or "")["port"]
        )

    def stats(self, proc: TaskHandle, memory: bool = True) -> dict[str, Any] | None:
        """``{"cpu_percent", "pss", "rss", "uptime_s"}`` of a live task, or ``None``.

        ``memory=False`` leaves out PSS and RSS (None) where that saves work:
        PSS walks every mapping of the process (about 45 ms for a TensorFlow
        task here), which a dashboard refreshing twice a second cannot afford.
        """
        if not proc.alive:
            return None
        try:
            reply = proc.request(Op.STATS, timeout=3.0)
        except (TimeoutError, ProcessLookupError):
            return None
        out = {k: reply.get(k) for k in ("cpu_percent", "pss", "rss", "uptime_s")}
        if not memory:
            out["pss"] = out["rss"] = None
        return out

    def listening(self, proc: TaskHandle) -> list[tuple[str, int]]:
        """``(host, port)`` of every TCP socket the task listens on (asked of the task)."""
        reply = proc.request(Op.LISTENING, timeout=5.0)
        return [(str(h), int(p)) for h, p in reply.get("addresses", [])]

    def read_log(self, proc: TaskHandle, tail: int | None = None) -> str:
        """The last ``tail`` lines of the task's log (all of it for ``None``)."""
        return read_tail(proc.log_path, tail)

    def task_log(self, log_path: str) -> str | None:
        """The log file the task itself writes (``None``: its stderr comes back to us)."""
        return None

    def prepare(self, cluster: dict[str, list[str]], procs: dict[TaskName, TaskHandle]) -> None:
        """Called once the addresses are chosen, before any task takes its role (tunnels go here)."""
        return None

    def client_address(self, defn: ClusterDef) -> str | None:
        """``host:port`` where the tasks reach this process as a client (``None``: TF's
        default, ``localhost``, which works while every task shares this machine's loopback)."""
        return None

    def diagnose(self, proc: TaskHandle, log_tail: str) -> str:
        """What the user should do about a task that did not come up ("" if nothing to add)."""
        return ""

    def close(self) -> None:
        """End anything the launcher itself holds (tunnels, a Spark job); tasks are killed apart."""
        return None

    def ended_by(self, proc: TaskHandle) -> str:
        """Who ended ``proc`` from outside, if anyone did ("Slurm ended job 12 (CANCELLED)"); else ""."""
        return ""

    def task_note(self, proc: TaskHandle) -> str:
        """What ``status`` notes of where ``proc`` runs beyond its host (a Slurm job and its node)."""
        return ""

    def security_note(self) -> str:
        return ""
