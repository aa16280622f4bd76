"""Looking at a running cluster: each task's condition and status row, its log, and the variable map.

Read-only: nothing here changes a task (``placeable`` connects the kernel's client before ops are
placed, and refuses a task that cannot take them).  :class:`~tfmagic.cluster.Cluster`
delegates ``status``, ``condition``, ``logs``, ``placement`` and ``device``'s checks here; the
dashboard's task table reads the same rows (``Cluster.status()``), so there
is one logic for a task's state.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from .. import client, variable_map
from ..errors import TaskLost
from ..launchers.base import TaskHandle, TaskState
from ..protocol import Op
from ..spec import TaskName
from ..status import ClusterStatus, TaskStatus

if TYPE_CHECKING:
    from .core import Cluster


def condition_of(proc: TaskHandle, stats: dict | None, slowness: float | None) -> str:
    """``running``, ``stopped (SIGSTOP)``, ``not answering`` or ``exited (CODE)`` from what was measured."""
    if getattr(proc, "state", None) is TaskState.KILLED:
        return "killed (modelled)"
    if not proc.alive:
        return f"exited ({proc.exit_code})"
    if stats and stats.get("run_state") == "stopped" and not slowness:
        return "stopped (SIGSTOP)"
    if not stats and proc.pid is not None:
        return "not answering"
    return str(proc.state)


def condition(cluster: Cluster, task: TaskName) -> str:
    proc = cluster.procs[task]
    stats = cluster.launcher.stats(proc, memory=False) if proc.alive else None
    return condition_of(proc, stats, cluster.slowness.get(task))


def _row(
    cluster: Cluster,
    label: str,
    address: str,
    proc: TaskHandle,
    slowness: float | None = None,
    memory: bool = True,
) -> TaskStatus:
    stats = (cluster.launcher.stats(proc, memory=memory) if proc.alive else None) or {}
    host = proc.destination or getattr(proc, "task_hostname", None) or proc.host
    return TaskStatus(
        task=label,
        address=address,
        pid=proc.task_pid,
        state=condition_of(proc, stats, slowness),
        cpu_percent=stats.get("cpu_percent"),
        pss=stats.get("pss"),
        rss=stats.get("rss"),
        uptime_s=stats.get("uptime_s"),
        host=f"{cluster.launcher.name}:{host}",
        note=", ".join(
            n
            for n in (
                f"slowed x{slowness:g}" if slowness else "",
                _sharing(proc),
                cluster.launcher.task_note(proc),
            )
            if n
        ),
        slowness=slowness or 1.0,
    )


def companions(proc: TaskHandle) -> list[str]:
    """The live tasks ``proc`` shares its process with (``processes=``); none for a process of its own."""
    return [str(p.task) for p in getattr(proc, "shared_with", ()) if p.task is not None and p.alive]


def name_some(names: list[str], most: int = 3) -> str:
    """``ps:0, worker:1, worker:2 and 14 more``."""
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _sharing(proc: TaskHandle) -> str:
    """``process of 17 tasks, with ps:0, worker:1, ...`` for a task sharing its process (``processes=``)."""
    others = companions(proc)
    hosted = getattr(proc, "shared_with", ())
    killed = sum(1 for p in hosted if not p.alive)  # killed alone, modelled: still in the process
    if not others:
        return ""
    return f"process of {len(hosted) + 1} tasks, with {name_some(others)}" + (
        f" ({killed} killed)" if killed else ""
    )


def status(cluster: Cluster, memory: bool | Collection[str] = True, spares: bool = True) -> ClusterStatus:
    """See :meth:`tfmagic.cluster.Cluster.status`."""
    defn = cluster.cluster_def
    rows = [
        _row(
            cluster,
            task,
            defn.address(task) if defn else "-",
            proc,
            cluster.slowness.get(task),
            memory if isinstance(memory, bool) else str(task) in memory,
        )
        for task, proc in list(cluster.procs.items())
    ]
    spares = [_row(cluster, "spare", "-", p) for p in cluster.pool.processes()] if spares else []
    notes = [] if rows else ["not running"]
    relay = cluster.network.note()
    if relay:
        notes.append(relay)
    notes.append(f"security: {cluster.launcher.security_note()}; {client.server_note()}")
    return ClusterStatus(
        name=cluster.name, shape=cluster.shape.describe(), tasks=rows, spares=spares, notes=notes
    )


def logs(cluster: Cluster, task: TaskName, tail: int | None = 50, native: bool = False) -> str:
    """See :meth:`tfmagic.cluster.Cluster.logs`."""
    from ..logs import without_native

    if native:
        return cluster.launcher.read_log(cluster.procs[task], tail=tail)
    # read enough to keep ``tail`` lines after the noise is gone
    text = cluster.launcher.read_log(cluster.procs[task], tail=None if tail is None else max(50 * tail, 2000))
    kept, hidden = without_native(text)
    lines = kept.splitlines()
    if tail is not None:
        lines = lines[-tail:] if tail else []
    if hidden:
        lines.append(f"({hidden} lines of TensorFlow's own log left out; --all, or native=True, shows them)")
    return "\n".join(lines)


def placement_of(cluster: Cluster, run=None) -> variable_map.Placement:
    """See :meth:`tfmagic.cluster.Cluster.placement`."""
    rows = variable_map.rows_for(cluster)
    for task, proc in cluster.procs.items():
        if not getattr(proc, "api_complete", False):
            continue  # no cell ran there: it holds only what this process put there
        try:
            reply = proc.request(Op.VARIABLES, timeout=5)
        except Exception:  # noqa: BLE001 - a task that cannot answer now is left out, and said so
            continue
        for v in reply.get("variables") or []:
            rows.append(
                variable_map.VariableRow(
                    v["name"],
                    TaskName.parse(v.get("task") or task),
                    tuple(v["shape"]),
                    v["dtype"],
                    int(v["bytes"]),
                    f"%%tf_px cell in {task}",
                )
            )
    out = variable_map.Placement(
        cluster.name,
        rows,
        assignment=(
            "tfmagic's training engine puts a model's variables on the ps tasks round-robin in the order "
            "the model makes them (w0 on ps:0, w1 on ps:1, ...), optimizer slots beside their variable; "
            "cells put them where %%tf_device (or tf.device) says"
        ),
    )
    if run is not None:
        history = getattr(run, "history", run)  # a TrainingRun or the History train() returned
        out.ran_steps = {t: len(recs) for t, recs in history.by_task().items()}
        held = {(r.name, str(r.task)) for r in rows}
        for name, task, shape, dtype, size in getattr(history, "layout", []):
            if (name, task) not in held and TaskName.parse(task) in cluster.procs:
                # the run ended and its variables were freed with it: shown where they were
                rows.append(
                    variable_map.VariableRow(
                        name, TaskName.parse(task), shape, dtype, size, f"{history.run} (ended, freed)"
                    )
                )
    shares = out.shares()
    if len(cluster.tasks("ps")) == 1 and shares:
        out.notes.append(
            "ps:0 holds every variable: all workers read and write there; --ps 2 (ps=2) spreads them"
        )
    elif shares:
        top, share = max(shares.items(), key=lambda kv: kv[1])
        if share >= 0.6:
            big = max((r for r in rows if r.task == top), key=lambda r: r.bytes)
            out.notes.append(
                f"{top} holds {share:.0%} of the ps bytes (largest: {big.name}); its link is the bottleneck. "
                f"Try more ps tasks, or split {big.name}"
            )
    return out


def placeable(cluster: Cluster, task: str | TaskName) -> tuple[TaskName, TaskHandle | None]:
    """``task`` checked for placing ops on it, the client connected: the task and its process.

    A stopped or dead task would make the ops wait for ever; each case is one line saying what to do.
    """
    t = cluster.check_task(task)
    proc = cluster.procs.get(t)
    if proc is not None and not proc.alive:
        raise TaskLost(
            f"{t} (pid {proc.pid}) is not running (exit code {proc.exit_code}); "
            f"restart it: cluster.restart('{t}')"
        )
    state = cluster.condition(t)
    if state.startswith(("stopped", "not answering")):
        raise TaskLost(
            f"{t} is {state}: ops placed on it would wait until it is continued. Continue it "
            f"(kill -CONT {proc.task_pid}) or replace it: cluster.restart('{t}', force=True)"
        )
    cluster.connect(force=client.is_connected(cluster.id) and t in client.omitted())
    if t in client.omitted():
        raise TaskLost(
            f"{t} does not answer ({cluster.condition(t)}); ops cannot be placed on it now. "
            f"cluster.why() says why; cluster.restart('{t}', force=True) replaces it"
        )
    return t, proc


__all__ = ["condition", "condition_of", "logs", "placeable", "placement_of", "status"]
