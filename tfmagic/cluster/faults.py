"""Stragglers and failures on purpose: slowing a task, killing it, starting it again.

A straggler slowed on a real cluster is throttled (its process paused and
resumed many times a second, :mod:`tfmagic.procs.throttle`); on a paced cluster its
modelled machine is slowed instead (:mod:`tfmagic.pace`).  A restart brings a
process up on the task's old address through the task set's one sequence
(:meth:`~tfmagic.cluster.taskset.TaskSet.bring_up`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .. import client
from ..errors import BadArgument, ClusterStartError, NeedsForce, SharedProcess, TaskLost
from ..launchers.base import TaskHandle
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
            "them; a task sharing a process cannot be killed, restarted, removed or throttled alone. "
            "Start the cluster without processes= for faults on one task"
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
    alone(cluster, t, "killing")
    cluster.taskset.ended_on_purpose(proc)
    proc.kill()
    _full_speed(cluster, t)
    cluster.emit("kill", t, f"process {proc.pid} killed")


def restart(
    cluster: Cluster, task: str | TaskName, timeout: float | None = None, force: bool = False
) -> StartOutcome:
    """See :meth:`tfmagic.cluster.Cluster.restart`."""
    t = cluster.check_task(task)
    defn = cluster.taskset.require()
    alone(cluster, t, "restarting")
    old = cluster.procs[t]
    # killed by tfmagic (cluster.kill), its handle not yet told: under load a Spark task's channel
    # reported the process alive after its pid was gone (a clean-clone run), and the restart that
    # follows a kill must not ask for force
    dying = cluster.taskset.was_ended_on_purpose(old)
    if old.alive and not force and not dying:
        held = (
            "its variables (every value stored on it)"
            if t.job == "ps"
            else "its state (variables, cell namespace)"
        )
        raise NeedsForce(
            f"{t} is running: restarting it would lose {held}. "
            f"Pass force=True (cluster.restart('{t}', force=True)) if that is what you want"
        )
    if old.alive:
        cluster.taskset.ended_on_purpose(old)
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
            cluster.taskset.bring_up(
                {t: proc},
                defn,
                lambda *_: None,
                deadline,
                bind_ports=cluster.network.bind_ports,
                what="the restart",
            )
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


__all__ = ["alone", "kill", "restart", "slow"]
