"""Elastic membership (``cluster.add``, ``cluster.remove``): add workers and ps to a running cluster and remove them, restarting nothing.

The cluster spec of a TensorFlow server is fixed when it starts, but the
eager client's is not: ``context.update_server_def`` with a definition that
has one more task makes the new task usable at once and leaves the others
running with their state (TensorFlow's ``remote_cluster_test.py``, "Add a
server to cluster, and run remote function on it").  The task processes
never need the new spec themselves: the client's definition is the one the
eager runtime uses.  So growing is: start (or take a warm spare) and give it
its role, then renew the connection in place; shrinking is: let the runs
that use the task finish with it, end its process, renew the connection.

Task indices of the others stay what they were: only the **highest-numbered
worker** (or ps) can be removed.  TensorFlow accepts sparse indices, but every
other part of a cluster (a job's ``0..n-1`` addresses in ``TF_CONFIG``,
exports, shards of the data, the placement map) reads a job as a list;
a hole in it would be one more state everything must handle, for no gain
to a user who only wants fewer workers.  Adding then takes the next index
again (``worker:2`` removed and added comes back as ``worker:2``).

What happens is published on ``cluster.events``: ``joined`` once the new
task is in the connection, ``leaving`` before a task goes (runs stop giving
it steps and say when they are done with it, see :class:`Departure`) and
``left`` once it is gone.  Training runs follow those (see
:mod:`tfmagic.training.failures`); ``status`` and the dashboard read the
cluster's tasks, which change with them.

A ps can be added too: an async or plain (fused) sync run that trains
pauses and moves the variables whose round-robin place changed to it
(:meth:`~tfmagic.training.params.ParameterStore.respread`, the bytes moved
and the pause recorded on its history); paced runs and sync with backup
workers keep theirs where they are; the next run spreads its own over every
ps.  Only the highest-numbered ps can be removed, and its variables are
moved off it first, the same way: while it is ``leaving`` it is out of every
run's ps set, so an async or plain sync run that trains and keeps variables
there holds the departure, pauses at a step boundary, re-spreads its
variables (and optimizer slots) round-robin over the ps that stay (with
three ps or more a variable on a staying ps can move too: ``w{i}`` goes to
``ps:{i % n}``), records ``ps:1 left at step 104: 336 B moved in 0.01 s
(...); steps held 0.03 s`` on its history (a ``left`` event the dashboard
marks) and lets go; a run that is not stepping (it ended, or has not begun)
has its variables moved at once by :func:`remove`.  Only then does the
process end; :attr:`Removed.notes` says what each run moved.  Runs register
themselves with :func:`track` so that :func:`remove` can ask each what it
keeps on the ps before anything happens.  What cannot be moved makes the
removal refuse, in one line, with the cluster as it was: variables a user
made there (``%%tf_device ps:1``, ``cluster.device("ps:1")``, a
``%%tf_px`` cell: tfmagic cannot re-point the user's Python objects at a
copy), and those of a paced run or of the per-worker sync loop while it
trains (gradients in flight, a buffer per worker beside each variable).
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Protocol

from .. import client
from ..errors import BadClusterShape, BadNet, NotOwned, UnknownTask
from ..spec import ClusterDef, TaskName
from . import faults

#: Seconds a removal waits for the runs using the task to be done with it.
RELEASE_TIMEOUT = 20.0


@dataclass
class Added:
    """What :func:`add` did: the new tasks, how long it took, how many came from warm spares."""

    tasks: list[TaskName]
    seconds: float
    warm: int = 0
    cold: int = 0


@dataclass
class Removed:
    """What :func:`remove` did; ``waited`` is how long the runs took to be done with the task."""

    task: TaskName
    seconds: float
    drained: bool
    waited: float = 0.0
    notes: list[str] = field(default_factory=list)


class Departure:
    """A task leaving a cluster, and the runs still using it.

    A run that follows the cluster's ``leaving`` event calls :meth:`hold`
    from its event handler (events are delivered on the publisher's thread,
    so every hold is in before :func:`remove` starts waiting) and
    :meth:`release` when its last call on the task has returned and its
    records are read.  ``drain`` says whether the task's step under way is
    finished (applied and recorded) or abandoned (dropped unapplied).
    """

    def __init__(self, task: TaskName, drain: bool) -> None:
        self.task = task
        self.drain = drain
        self._cond = threading.Condition()
        self._holders: set[str] = set()

    def hold(self, who: str) -> None:
        with self._cond:
            self._holders.add(who)

    def release(self, who: str) -> None:
        with self._cond:
            self._holders.discard(who)
            self._cond.notify_all()

    def wait(self, timeout: float) -> list[str]:
        """Wait until no run holds the task; the holders left when ``timeout`` passed."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._holders:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.25))
            return sorted(self._holders)


_departures: dict[tuple[int, str], Departure] = {}


def departure(cluster_id: int, task: TaskName) -> Departure | None:
    """The departure under way of ``task`` in cluster ``cluster_id`` (None: it is not leaving)."""
    return _departures.get((cluster_id, str(task)))


class PsHolder(Protocol):
    """What :func:`remove` asks of a training run (its failure policy) before a ps goes."""

    #: why its last move off a leaving ps did not happen (None: it did, or none was asked)
    move_error: str | None
    #: the ps it moved its variables off, and what it recorded on its history about it
    moved_off: dict[TaskName, str]

    def ps_report(self, task: TaskName) -> tuple[str, list[str], str | None]:
        """(run name, names it keeps on ``task``, why it cannot move them now or None)."""
        ...

    def move_off_now(self, task: TaskName) -> None:
        """Move them off ``task`` now if the run is not stepping (a stepping run moves at a pause)."""
        ...


_holders: dict[int, weakref.WeakSet] = {}
_holders_lock = threading.Lock()


def track(cluster_id: int, holder: PsHolder) -> None:
    """A run keeping variables on cluster ``cluster_id``'s ps: asked about them before a ps is removed.

    Held weakly: a run that is garbage-collected (and its variables with it) drops out by itself.
    """
    with _holders_lock:
        _holders.setdefault(cluster_id, weakref.WeakSet()).add(holder)


def _holders_of(cluster_id: int) -> list[PsHolder]:
    with _holders_lock:
        return list(_holders.get(cluster_id, ()))


#: Owners (in the placement map) of what tfmagic's training engine makes: it can move those.
_ENGINE_OWNERS = ("training ", "sync gradient buffers")


def _names(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (", ..." if len(names) > n else "")


def _check_ps_can_go(cluster, t: TaskName) -> None:
    """Refuse (one line, nothing changed) when something on ``t`` cannot be moved off it."""
    rows = [r for r in cluster.placement().rows if r.task == t and not r.freed]
    mine = [r for r in rows if not r.owner.startswith(_ENGINE_OWNERS)]
    if mine:
        owners = sorted({r.owner for r in mine})
        raise BadClusterShape(
            f"{t} holds {len(mine)} variable(s) you made ({_names([r.name for r in mine])}; by "
            f"{_names(owners, 2)}): tfmagic moves a training run's variables off a leaving ps but cannot "
            f"re-point your own Python objects at a copy, so removing {t} would lose them. Copy what you "
            f"need to another ps (with cluster.device('ps:0'): v2 = tf.Variable(v)), del the ones on {t}, "
            "then remove it again"
        )
    for holder in _holders_of(cluster.id):
        name, held, why = holder.ps_report(t)
        if held and why:
            raise BadClusterShape(
                f"{t} holds {len(held)} variable(s) of training run {name} ({_names(held)}), which cannot "
                f"move them while it trains: {why}. Stop it (run.stop()) or let it end, then remove {t} "
                "again; async and plain sync runs move theirs off a leaving ps"
            )


def _check_owned(cluster) -> None:
    from ..launchers.attached import AttachedLauncher

    if isinstance(cluster.launcher, AttachedLauncher):
        raise NotOwned(
            f"cluster {cluster.name} was attached, not started by tfmagic: tfmagic cannot start or end its tasks. "
            "Start the new task where the cluster runs and attach again with the bigger spec"
        )


def _check_launcher(cluster) -> None:
    if cluster.launcher.name == "spark":
        raise BadClusterShape(
            "a Spark cluster's tasks run as one barrier job fixed at start: a task cannot join or leave it. "
            "Start a bigger (or smaller) one instead: %tf_cluster start --backend spark ... --replace"
        )


def add(cluster, job: str = "worker", count: int = 1, timeout: float | None = None) -> Added:
    """Start ``count`` new ``job`` tasks (warm spares first) and connect them in place.

    Nothing else is restarted: variables on the ps, cells placed before and
    runs in progress keep working.  On any failure the new processes are
    ended and the cluster is as it was.
    """
    defn = cluster.taskset.require()
    _check_owned(cluster)
    _check_launcher(cluster)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise BadClusterShape(f"count must be a whole number >= 1, not {count!r}; for example count=1")
    if job not in ("worker", "ps"):
        raise UnknownTask(
            f"{job!r} is not a job tfmagic can add to; add workers or ps: cluster.add('worker') or "
            "%tf_cluster add worker"
        )
    if cluster.collective:
        raise BadClusterShape(
            "a collective (all-reduce) cluster's workers form one group fixed at start; "
            "start a bigger one instead (%tf_cluster start --workers N --collective --replace)"
        )
    first = len(defn.jobs.get(job, []))
    behind = [t for t in (TaskName(job, first + i) for i in range(count)) if cluster.shaped(t) is not None]
    if behind:  # its address would have to be a relay's port, which only a start gives
        raise BadNet(
            f"{behind[0]} would sit behind the modelled network's relay ({', '.join(cluster.net_models)}), and "
            "a task added to a running cluster gets none yet; start the cluster at the size you want instead"
        )
    _check_the_others_answer(cluster, "adding a task")
    taskset = cluster.taskset
    with taskset.lock:
        t0 = time.monotonic()
        deadline = t0 + (timeout or cluster.start_timeout)
        tasks = [TaskName(job, first + i) for i in range(count)]
        taskset.check_fits(count)
        hosts = cluster.launcher.hosts_for(len(defn.tasks()) + count)[-count:]
        procs, warm = taskset.processes_for(tasks, hosts)
        try:
            new = taskset.choose_addresses(procs, base=defn)
            taskset.bring_up(procs, new, lambda *_: None, deadline, what="the addition to")
        except BaseException:
            for proc in procs.values():
                proc.kill()
            raise
        warm_pids = {p.pid for p in procs.values() if p.warm_at is not None} if warm else set()
        old_defn = taskset.cluster_def
        taskset.serve(procs, new)
        was_connected = client.is_connected(cluster.id)
        try:
            if was_connected:
                cluster.connect()
        except BaseException:
            for proc in taskset.withdraw(tasks, old_defn):
                proc.kill()
            if was_connected:
                try:
                    cluster.connect(force=True)
                except Exception:  # noqa: BLE001 - the first error is the one to report
                    pass
            raise
        seconds = time.monotonic() - t0
    for task, proc in procs.items():
        how = "a warm spare" if proc.pid in warm_pids else "a new process"
        cluster.emit("joined", task, f"{how}, pid {proc.pid}, on {new.address(task)}")
    if cluster.use_spares:
        cluster.pool.fill_later(cluster.launcher, count)  # ready for the next add
    return Added(tasks, seconds, warm=warm, cold=count - warm)


def remove(cluster, task: str | TaskName, drain: bool = False, timeout: float = RELEASE_TIMEOUT) -> Removed:
    """End ``task`` (the highest-numbered worker or ps) once the runs using it let go.

    ``drain=True``: a run lets the worker finish the step it is computing
    (applied and recorded); ``drain=False``: the step not yet applied is
    dropped.  A call already running on the worker is never cut in half
    either way (ending a worker inside its apply could count an update that
    was never applied): the runs stop giving it work and say when their
    last call returned.  The others keep their indices and their state.

    A ps goes once every training run's variables are moved off it (see the
    module's docstring); ``drain`` does not apply.  Variables a user made
    there, or a paced or per-worker sync run training with variables there,
    make it refuse before anything changes.
    """
    defn = cluster.taskset.require()
    _check_owned(cluster)
    _check_launcher(cluster)
    t = cluster.check_task(task)
    if t.job not in ("worker", "ps"):
        raise BadClusterShape(f"only workers and ps can be removed, not {t}")
    peers = defn.jobs.get(t.job, [])
    if len(peers) <= 1:
        raise BadClusterShape(
            f"{t} is the last {t.job}: the cluster needs it (its variables live there)"
            if t.job == "ps"
            else f"{t} is the last worker: a cluster needs at least one; stop it instead"
        )
    last = TaskName(t.job, len(peers) - 1)
    if t != last:
        raise BadClusterShape(
            f"only the highest-numbered {t.job} can be removed ({last}), so the other tasks keep their "
            f"indices; remove {last} instead"
        )
    faults.alone(cluster, t, "removing")
    if t.job == "ps" and cluster.procs[t].alive and not _answers(cluster, t):
        # it still holds its variables and cannot hand them over: ending it would lose them, and a
        # run training with them would wait on them for ever
        raise BadClusterShape(
            f"{t} is {cluster.condition(t)} and cannot hand over its variables; continue it "
            f"(kill -CONT {cluster.procs[t].task_pid}) and remove it again, or kill it first "
            f"(cluster.kill('{t}')) to give its variables up"
        )
    # a ps that is gone took its variables with it: nothing to move, nothing to lose
    moving = t.job == "ps" and _answers(cluster, t)
    if moving:
        _check_ps_can_go(cluster, t)
    if cluster.collective:
        raise BadClusterShape("a collective (all-reduce) cluster's workers form one group fixed at start")
    t0 = time.monotonic()
    key = (cluster.id, str(t))
    if key in _departures:
        raise BadClusterShape(f"{t} is already being removed")
    dep = _departures[key] = Departure(t, drain)
    try:
        if moving:
            cluster.emit("leaving", t, "the runs move their variables off it first")
            for holder in _holders_of(cluster.id):
                holder.move_off_now(t)  # runs not stepping; a stepping one moves at its next pause
        else:
            cluster.emit(
                "leaving", t, "finishing its current step" if drain else "its step under way is dropped"
            )
        holders = dep.wait(timeout)
        waited = time.monotonic() - t0
        notes = []
        if moving:
            _check_moved_off(cluster, t, holders, timeout)
            for holder in _holders_of(cluster.id):
                if t in holder.moved_off:
                    notes.append(f"training run {holder.ps_report(t)[0]}: {holder.moved_off[t]}")
        elif holders:
            notes.append(
                f"{', '.join(holders)} did not let go of {t} within {timeout:g} s; it was removed anyway"
            )
        with cluster.taskset.lock:
            try:  # here, not first: a run that cannot let go says so first (it says more)
                _check_the_others_answer(cluster, f"removing {t}", but=t)
            except BadClusterShape as exc:
                cluster.emit("stayed", t, str(exc))
                raise
            answers = _answers(cluster, t)
            jobs = defn.as_dict()
            jobs[t.job] = jobs[t.job][:-1]
            (proc,) = cluster.taskset.withdraw([t], ClusterDef.from_mapping(jobs))
            if cluster.pace is not None:
                cluster.pace.set_slowdown(t, 1)
            # Out of the connection first while it answers (TensorFlow closes its context there; ended
            # first, that close fails loudly on stderr); a task that does not answer is ended first.
            if not answers:
                with client.steady_connection():
                    proc.kill()
            if client.is_connected(cluster.id):
                cluster.connect()
            with client.steady_connection():
                proc.kill()
    finally:
        _departures.pop(key, None)
    cluster.emit("left", t, f"process {proc.pid} ended" + (" after its step" if drain else ""))
    return Removed(t, time.monotonic() - t0, drain, waited, notes)


#: the conditions (``Cluster.condition``) of a live task that cannot answer a connection's renewal
SILENT = ("stopped", "not answering")


def _answers(cluster, t: TaskName) -> bool:
    return cluster.procs[t].alive and not cluster.condition(t).startswith(SILENT)


def _check_the_others_answer(cluster, doing: str, but: TaskName | None = None) -> None:
    """Refuse a change of membership while a live task other than ``but`` is stopped or not answering.

    Adding or removing renews the client's connection (``update_server_def``), and TensorFlow renews
    it with the devices of the tasks that answer: a task SIGSTOPped meanwhile was left out of it for
    good (measured: an add finished in 2.5 s, and every op on the stopped worker failed afterwards with
    "unknown device", its async thread retrying until the run gave up), though it answered again
    once continued.  Nothing has changed when this refuses.
    """
    for t in cluster.tasks():
        if t == but or not cluster.procs[t].alive:
            continue
        state = cluster.condition(t)
        if state.startswith(SILENT):
            raise BadClusterShape(
                f"{t} is {state}: {doing} renews the client's connection, which would leave {t} out of it "
                f"for good; continue it (kill -CONT {cluster.procs[t].task_pid}) and try again, or "
                f"restart it first (cluster.restart('{t}', force=True))"
            )


def _check_moved_off(cluster, t: TaskName, holders: list[str], timeout: float) -> None:
    """After the runs let go: a run that still keeps something on ``t`` (it could not pause in time,
    or began to train with variables there since the check) keeps ``t`` in the cluster, and says so."""
    for holder in _holders_of(cluster.id):
        name, held, why = holder.ps_report(t)
        if held:
            reason = (
                why
                or holder.move_error
                or (
                    f"it did not pause to move them within {timeout:g} s"
                    if holders
                    else "they could not be moved"
                )
            )
            cluster.emit("stayed", t, f"training run {name} still keeps variables there")
            raise BadClusterShape(
                f"{t} was not removed: training run {name} still keeps {len(held)} variable(s) there "
                f"({_names(held)}): {reason}. Stop the run (run.stop()) and remove {t} again"
            )


__all__ = ["Added", "Departure", "PsHolder", "Removed", "add", "departure", "remove", "track"]
