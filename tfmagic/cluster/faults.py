"""Stragglers and failures on purpose: slowing a task, killing it, starting it again.

A straggler slowed on a real cluster is throttled (its process paused and
resumed many times a second, :mod:`tfmagic.procs.throttle`); on a paced cluster its
modelled machine is slowed instead (:mod:`tfmagic.pace`).  A restart brings a
process up on the task's old address through the task set's one sequence
(:meth:`~tfmagic.cluster.taskset.TaskSet.bring_up`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, NoReturn

from .. import client
from ..errors import BadArgument, ClusterStartError, NeedsForce, SharedProcess, TaskLost, WaitTimedOut
from ..launchers.base import TaskHandle, TaskState
from ..protocol import Op
from ..spec import TaskName
from . import inspection
from .outcomes import Restarted, StartOutcome
from .taskset import _PortTaken

if TYPE_CHECKING:
    from .core import Cluster


def _live(cluster: Cluster, task: str | TaskName) -> tuple[TaskName, TaskHandle]:
    t = cluster.check_task(task)
    proc = cluster.procs[t]
    if not proc.alive:
        raise TaskLost(f"{t} (pid {proc.pid}) is not running; restart it first: cluster.restart('{t}')")
    return t, proc


def alone(cluster: Cluster, t: TaskName, doing: str) -> None:
    """One line when ``t`` shares its process (``processes=``): ``doing`` it would do it to them all."""
    proc = cluster.procs.get(t)
    others = inspection.companions(proc)
    if others:
        raise SharedProcess(
            f"{t} shares process {proc.pid} with {inspection.name_some(others)} (processes=): {doing} it would do the same to "
            "them; a task sharing a process cannot be removed or throttled alone (it can be killed and "
            "restarted: its death is modelled). Start the cluster without processes= for that"
            + ("" if cluster.pace is not None else ", or with a pace (--pace) to slow one modelled worker")
        )


def slow(cluster: Cluster, task: str | TaskName, factor: float = 4.0) -> None:
    """See :meth:`tfmagic.cluster.Cluster.slow`."""
    try:
        factor = float(factor)
    except (TypeError, ValueError):
        raise BadArgument(f"factor must be a number >= 1, not {factor!r}") from None
    if not factor >= 1.0 or factor == float("inf"):
        raise BadArgument(f"factor must be a number >= 1 (1 restores full speed), not {factor:g}")
    t, proc = _live(cluster, task)
    if cluster.pace is not None:
        cluster.pace.set_slowdown(t, factor)
        if factor > 1:
            cluster.slowness[t] = factor
        else:
            cluster.slowness.pop(t, None)
        cluster.emit("slow", t, (f"x{factor:g}" if factor > 1 else "full speed") + " (modelled)")
        return
    alone(cluster, t, "throttling")
    try:
        proc.request(Op.SLOW, factor=factor, timeout=5)
    except TimeoutError:
        raise TaskLost(
            f"{t} (pid {proc.task_pid}) did not answer within 5 s (stopped, or hung): it cannot be slowed now; "
            f"cluster.why() says what it waits on, cluster.restart('{t}', force=True) replaces it"
        ) from None
    if factor > 1:
        cluster.slowness[t] = factor
    else:
        cluster.slowness.pop(t, None)
    cluster.emit("slow", t, f"x{factor:g}" if factor > 1 else "full speed")


def _full_speed(cluster: Cluster, t: TaskName) -> None:
    """A new (or dead) process: no throttle, and a modelled machine back at its normal speed."""
    cluster.slowness.pop(t, None)
    if cluster.pace is not None:
        cluster.pace.set_slowdown(t, 1)


def kill(cluster: Cluster, task: str | TaskName) -> None:
    """See :meth:`tfmagic.cluster.Cluster.kill`."""
    t, proc = _live(cluster, task)
    if getattr(proc, "shared_with", None):  # even when the others are cut off: the process hosts them
        _cut_off(cluster, t, proc)
        return
    cluster.taskset.ended_on_purpose(proc)
    with client.steady_connection():
        proc.kill()
    _full_speed(cluster, t)
    cluster.emit("kill", t, f"process {proc.pid} killed")


def _cut_off(cluster: Cluster, t: TaskName, proc) -> None:
    """Kill a task that shares its process alone, as modelled (:meth:`TaskProcess.cut_off`).

    Its server stops answering and its connections break, as a dead machine's do; the process
    lives on for the tasks it shares. The engine sees what it sees of a killed process: calls
    that fail, a task that is not alive. Not reported as lost: the kill event says it.
    """
    others = inspection.companions(proc)
    try:
        with client.steady_connection():
            cut = proc.cut_off(timeout=5)
    except (TimeoutError, WaitTimedOut, ProcessLookupError) as exc:
        raise TaskLost(
            f"{t} did not answer the kill within 5 s ({exc}): its process {proc.pid} is stopped or hung; "
            f"cluster.why() says what it waits on"
        ) from None
    _full_speed(cluster, t)
    cluster.emit(
        "kill",
        t,
        f"its server cut off ({cut} connections; modelled: process {proc.pid} "
        + (f"serves {inspection.name_some(others)} on)" if others else "lives on)"),
    )


def restart(
    cluster: Cluster, task: str | TaskName, timeout: float | None = None, force: bool = False
) -> StartOutcome:
    """See :meth:`tfmagic.cluster.Cluster.restart`."""
    t = cluster.check_task(task)
    defn = cluster.taskset.require()
    old = cluster.procs[t]
    if getattr(old, "shared_with", None):
        return _serve_again(cluster, t, old, defn, timeout, force)
    # killed by tfmagic (cluster.kill), its handle not yet told: under load a Spark task's channel
    # reported the process alive after its pid was gone (a clean-clone run), and the restart that
    # follows a kill must not ask for force
    dying = cluster.taskset.was_ended_on_purpose(old)
    if old.alive and not force and not dying:
        _refuse_without_force(t, "its state (variables, cell namespace)")
    if old.alive:
        cluster.taskset.ended_on_purpose(old)
        with client.steady_connection():
            old.kill()
    t0 = time.monotonic()
    deadline = t0 + (timeout or cluster.start_timeout)
    taken = cluster.pool.take(cluster.launcher, 1) if cluster.use_spares else []
    warm = bool(taken and taken[0].warm_at)
    for attempt in range(1, 30):  # noqa: B007 - reported in the outcome
        proc = (
            taken.pop()
            if taken
            else cluster.launcher.spawn(cluster.taskset.log_path(t), old.destination or old.host)
        )
        try:
            _bring_back(cluster, t, proc, defn, deadline)
            break
        except _PortTaken:
            proc.kill()
            if time.monotonic() > deadline:
                raise cluster.taskset.failure(
                    t, proc, f"could not get its port {defn.address(t)} back in time"
                )
            time.sleep(0.2)  # the old listener may still be closing
        except BaseException:
            proc.kill()
            raise
    else:  # pragma: no cover - 30 port clashes in a row
        raise ClusterStartError(f"{t} could not get its port {defn.address(t)} back")
    with cluster.taskset.lock:  # only the swap: a stop is not held up by a restart's wait
        cluster.taskset.replace(t, proc)
        _full_speed(cluster, t)
    if client.is_connected(cluster.id):
        cluster.connect(force=True)
    cluster.emit("restart", t, f"process {proc.pid}" + (" (warm spare)" if warm else ""))
    if cluster.use_spares:
        cluster.pool.fill_later(cluster.launcher, cluster.shape.size)
    return Restarted(seconds=time.monotonic() - t0, warm=int(warm), cold=int(not warm), attempts=attempt)


def _refuse_without_force(t: TaskName, worker_holds: str) -> NoReturn:
    """The one line for a restart of a running task without force: what it would lose."""
    held = "its variables (every value stored on it)" if t.job == "ps" else worker_holds
    raise NeedsForce(
        f"{t} is running: restarting it would lose {held}. "
        f"Pass force=True (cluster.restart('{t}', force=True)) if that is what you want"
    )


def _bring_back(cluster: Cluster, t: TaskName, proc, defn, deadline: float) -> None:
    """Give ``proc`` ``t``'s role on its old address, through the task set's one sequence."""
    cluster.taskset.bring_up(
        {t: proc}, defn, lambda *_: None, deadline, bind_ports=cluster.network.bind_ports, what="the restart"
    )


def _serve_again(
    cluster: Cluster, t: TaskName, proc, defn, timeout: float | None, force: bool
) -> StartOutcome:
    """Restart a task that shares its process: a new server on its port, in the same process.

    A dead machine comes back empty: the new server holds no variables and no state of the old one,
    which stays in the process, unreachable (TensorFlow cannot free a server: about 30 MB each time).
    A live task is cut off first (with ``force``, as a restart of a process of its own kills it).
    """
    if proc.alive:
        if not force:
            _refuse_without_force(t, "its state")  # no cell namespace: a shared task runs no cells
        _cut_off(cluster, t, proc)
    if proc.state is not TaskState.KILLED:
        raise TaskLost(
            f"{t}'s process {proc.pid} ended, and the tasks it hosted with it: it cannot be restarted alone; "
            "stop the cluster and start it again"
        )
    t0 = time.monotonic()
    proc.revive()
    deadline = t0 + (timeout or cluster.start_timeout)
    try:
        _bring_back(cluster, t, proc, defn, deadline)
    except _PortTaken:
        proc.mark_cut_off()  # still dead, and still restartable
        raise ClusterStartError(
            f"{t} could not get its port {defn.address(t)} back: another program took it after the kill; "
            f"end that program, then cluster.restart('{t}') again"
        ) from None
    except BaseException:
        proc.mark_cut_off()
        raise
    _full_speed(cluster, t)
    if client.is_connected(cluster.id):
        cluster.connect(force=True)
    cluster.emit("restart", t, f"a new server in process {proc.pid} (shared)")
    return Restarted(seconds=time.monotonic() - t0, warm=0, cold=0, attempts=1)


__all__ = ["alone", "kill", "restart", "slow"]
