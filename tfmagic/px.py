"""Between-graph replication: run the same code inside every task (``%%tf_px``).

The seeds' main pattern is one program per task, each with its own
``job_name`` and ``task_index``.  :func:`run_px` sends a cell's code to the
chosen tasks over their control channel (a pipe only this process holds: no
one else can send code to a task); each task runs it in its own persistent
namespace, with ``cluster``, ``job_name``, ``task_index``, ``server`` and
``TF_CONFIG`` ready, and streams its output back line by line.

    run = run_px(cluster, "print(job_name, task_index)", targets="worker:*")
    run.wait()["worker:1"].stdout      # 'worker 1\\n'
"""

from __future__ import annotations

import base64
import itertools
import os
import pickle
import queue
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from . import doctor, events
from .doctor import waits
from .errors import PxError, WaitTimedOut
from .metrics import GlobalStep, History, StepRecord
from .protocol import Event, Op
from .spec import TaskName

__all__ = ["PxError", "PxRun", "TaskOutcome", "parse_targets", "run_px"]

_ids = itertools.count(1)


@dataclass
class TaskOutcome:
    """What one task did with the cell."""

    task: str
    status: str = "running"  # running | ok | error | died | interrupted | stopped
    result: object = None
    result_repr: str | None = None
    ename: str | None = None
    evalue: str | None = None
    traceback: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    ended: float | None = None

    #: the streams' pieces as they came: joined when read, so a long output costs linear time
    _streams: dict = field(default_factory=lambda: {"stdout": [], "stderr": []}, repr=False)

    @property
    def done(self) -> bool:
        return self.status != "running"

    def add(self, name: str, text: str) -> None:
        """Append ``text`` to the stream ``name`` (``stdout`` or ``stderr``)."""
        self._streams["stderr" if name == "stderr" else "stdout"].append(text)

    def _joined(self, name: str) -> str:
        parts = self._streams[name]
        if len(parts) > 1:
            parts[:] = ["".join(parts)]
        return parts[0] if parts else ""

    @property
    def stdout(self) -> str:
        """Everything the task's cell printed to stdout so far."""
        return self._joined("stdout")

    @property
    def stderr(self) -> str:
        """Everything the task's cell printed to stderr so far."""
        return self._joined("stderr")


def parse_targets(cluster, targets: str | None) -> list[TaskName]:
    """``all`` (default), ``worker:*``, ``ps:0``, or a comma list of those."""
    defn = cluster.cluster_def
    if defn is None:
        raise PxError("the cluster is not running; start it first (%tf_cluster start)")
    every = defn.tasks()
    if not targets or targets.strip() == "all":
        return every
    chosen: list[TaskName] = []
    for part in targets.split(","):
        part = part.strip()
        if part.endswith(":*"):
            job = part[:-2]
            found = [t for t in every if t.job == job]
            if not found:
                jobs = sorted({t.job for t in every})
                raise PxError(f"no job {job!r} in this cluster (it has {', '.join(jobs)}); use e.g. worker:*")
            chosen.extend(found)
        else:
            chosen.append(defn.check(part))
    return list(dict.fromkeys(chosen))


class PxRun:
    """One cell running in several tasks; outputs arrive while it runs.

    ``events`` yields ``(task, kind, payload)`` as they come (``stream``,
    ``done``, ``died``); ``wait()`` returns every task's :class:`TaskOutcome`;
    ``interrupt()`` raises KeyboardInterrupt in the tasks still running.
    Steps that the cell reports with ``report(step=..., loss=...)`` go to
    ``history`` (the same metrics the training engine records).
    """

    def __init__(self, cluster, code: str, targets: list[TaskName], name: str | None = None) -> None:
        self.cluster = cluster
        self.code = code
        self.targets = targets
        self.id = f"px{os.getpid()}-{next(_ids)}"
        self.name = name or self.id
        self.outcomes = {str(t): TaskOutcome(str(t)) for t in targets}
        self.events: queue.Queue = queue.Queue()
        self.history = History("px", run=self.name, workers=[str(t) for t in targets if t.job == "worker"])
        self._cond = threading.Condition()
        self._procs = {}
        self._subscriptions = {}
        self._waits: dict[str, int] = {}
        #: {task: value of the cell's last expression}, filled in as each task finishes
        self.live_results: dict[str, object] = {}
        self._last_report: dict[str, float] = {}
        self._seen_steps: set[int] = set()
        #: tasks whose first cell this is: they complete TensorFlow's Python API first (seconds)
        self.importing: list[str] = []
        #: tasks past the cell's barrier preparation (its imports), waiting for every target
        self._ready: set[str] = set()
        self._released = False
        self._sent = False  # every target has been sent the cell (a quick one may be ready before)
        #: when the barrier let every target start the cell's body (None: not yet, or one target)
        self.started_together_at: float | None = None

    # -- sending ---------------------------------------------------------------
    def start(self) -> PxRun:
        """Send the cell to every target.

        With several targets the cell has a barrier: each task first does what
        is slow (the first cell's TensorFlow API, the cell's leading imports),
        then says ``exec_ready``; once every target has (or has died) they are
        all told ``go`` at once, so between-graph workers start the body
        together instead of one training alone while the other still imports.
        """
        self._cluster_sub = self.cluster.events.subscribe(self._on_cluster_event)
        barrier = len(self.targets) > 1
        for task in self.targets:
            proc = self.cluster.procs.get(task)
            outcome = self.outcomes[str(task)]
            if proc is None or not proc.alive:
                outcome.status, outcome.ended = "died", time.time()
                outcome.evalue = f"{task} is not running; restart it (%tf_cluster restart {task})"
                self.events.put((str(task), "died", outcome.evalue))
                continue
            self._procs[str(task)] = proc
            self._subscriptions[str(task)] = proc.messages.subscribe(self._listener(str(task), proc))
            self._waits[str(task)] = waits.begin(
                f"a %%tf_px cell ({self.name})", [task], "the cell", self.cluster.id
            )
            if not proc.api_complete:
                self.importing.append(str(task))
                proc.api_complete = True  # the task completes it before it runs this cell
            proc.send(Op.EXEC, id=self.id, code=self.code, filename=f"<tf_px {task}>", barrier=barrier)
            self._last_report[str(task)] = time.time()
        with self._cond:
            self._sent = True
        with _ACTIVE_LOCK:
            _ACTIVE.add(self)
        events.started.publish(self)
        if barrier:
            self._release_if_ready()
        if self.done:
            self._cluster_sub.close()
        return self

    def _on_cluster_event(self, event) -> None:
        if event.kind == "stopping":
            for task, outcome in self.outcomes.items():
                if not outcome.done:
                    self._finish(task, "stopped", evalue=f"{event.detail} while the cell ran")

    def _listener(self, task: str, proc):
        def on_event(msg: dict) -> None:
            kind = msg.get("event")
            if kind == Event.EXIT:
                self._finish(
                    task,
                    "died",
                    evalue=f"the task's process ended (exit code {msg.get('code')}) during the cell",
                )
                return
            if msg.get("id") != self.id and msg.get("exec_id") != self.id:
                return
            outcome = self.outcomes[task]
            if kind == Event.EXEC_READY:
                with self._cond:
                    self._ready.add(task)
                self._release_if_ready()
            elif kind == Event.STREAM:
                outcome.add(msg.get("name") or "stdout", msg["text"])
                self.events.put((task, "stream", (msg.get("name"), msg["text"])))
            elif kind == Event.REPORT:
                self._on_report(task, msg)
            elif kind == Event.EXEC_DONE:
                proc.forget_reply(self.id)
                if msg.get("status") == "ok":
                    if msg.get("pickle"):
                        try:
                            outcome.result = pickle.loads(base64.b64decode(msg["pickle"]))
                        except Exception:  # noqa: BLE001 - e.g. a class only the task knows
                            outcome.result = msg.get("repr")
                    outcome.result_repr = msg.get("repr")
                    self._finish(task, "ok")
                else:
                    status = "interrupted" if msg.get("ename") == "KeyboardInterrupt" else "error"
                    self._finish(
                        task,
                        status,
                        ename=msg.get("ename"),
                        evalue=msg.get("evalue"),
                        tb=msg.get("traceback") or [],
                    )

        return on_event

    def _on_report(self, task: str, msg: dict) -> None:
        now = msg.get("time") or time.time()
        start = self._last_report.get(task, now)
        self._last_report[task] = now
        step = msg.get("step")
        loss = msg.get("loss")
        self.history.add_step(
            StepRecord(
                task,
                step if step is not None else -1,
                start,
                now,
                loss if loss is not None else float("nan"),
                mode="px",
            )
        )
        if step is not None and loss is not None and step not in self._seen_steps:
            self._seen_steps.add(step)
            self.history.add_global(GlobalStep(step, now, loss, aggregated=(task,)))

    def _release_if_ready(self) -> None:
        """Tell every waiting target ``go`` once none is still preparing (see :meth:`start`)."""
        with self._cond:
            if self._released or not self._sent or not self._procs:
                return
            if any(t not in self._ready and not self.outcomes[t].done for t in self._procs):
                return
            self._released = True
            self.started_together_at = time.time()
            waiting = [t for t in self._procs if t in self._ready and not self.outcomes[t].done]
        for task in waiting:
            self._last_report[task] = self.started_together_at
            self.outcomes[task].started = self.started_together_at
            self._procs[task].send(Op.GO, exec_id=self.id)

    def _finish(self, task: str, status: str, ename=None, evalue=None, tb=None) -> None:
        with self._cond:
            outcome = self.outcomes[task]
            if outcome.done:
                return
            outcome.status, outcome.ended = status, time.time()
            outcome.ename, outcome.evalue, outcome.traceback = ename, evalue, tb or []
            self.live_results[task] = outcome.result
            wait = self._waits.pop(task, None)
            if wait is not None:
                waits.end(wait)
            sub = self._subscriptions.pop(task, None)
            if sub is not None:
                sub.close()
            self._cond.notify_all()
        self.events.put((task, status, outcome))
        if len(self.targets) > 1:
            self._release_if_ready()  # a target that died before its barrier holds no one back
        if all(o.done for o in self.outcomes.values()):
            self.history.ended_at = time.time()
            cluster_sub = getattr(self, "_cluster_sub", None)
            if cluster_sub is not None:
                cluster_sub.close()

    # -- waiting ---------------------------------------------------------------
    @property
    def done(self) -> bool:
        return all(o.done for o in self.outcomes.values())

    @property
    def running(self) -> bool:
        return not self.done

    def wait(self, timeout: float | None = None) -> dict[str, TaskOutcome]:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self.done:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise WaitTimedOut(
                        f"%%tf_px still running in {[t for t, o in self.outcomes.items() if not o.done]}"
                    )
                self._cond.wait(0.2 if left is None else min(left, 0.2))
        return self.outcomes

    def interrupt(self) -> None:
        """KeyboardInterrupt in every task still running the cell."""
        for task, outcome in self.outcomes.items():
            proc = self._procs.get(task)
            if proc is not None and not outcome.done:
                proc.send(Op.INTERRUPT, exec_id=self.id)

    cancel = interrupt

    def follow(self, say: Callable[[str], str] = str) -> list[str]:
        """Print the tasks' output as it arrives, each line prefixed with its task, until every task
        has finished the cell (an interrupt interrupts them; a task stopped from outside or one that
        does not stop within 10 s of an interrupt is left to go on); returns what went wrong, per task.
        What ``%%tf_px`` shows, for scripts too: advice is written as Python (``cluster.logs('worker:1')``),
        and ``say`` rewrites it for another reader (the magic passes its own: ``%tf_cluster logs worker:1``)."""
        if self.importing:
            print(
                f"({', '.join(self.importing)}: importing TensorFlow's Python API for a first cell, "
                "a few seconds; the servers did not need it)",
                file=sys.stderr,
            )
        # While we wait here a kernel interrupt only sets a flag. Raised as KeyboardInterrupt at
        # any bytecode, it can land inside the event queue's locking and leave its lock held; the
        # tasks' reader threads and this loop then wait forever. A full test run once hung just
        # after an interrupt in a way that fits this.
        sigint = [False]
        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGINT, lambda signum, frame: sigint.__setitem__(0, True))
        try:
            self._follow_events(sigint, say)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        failed = []
        for task, outcome in self.outcomes.items():
            if outcome.status == "error":
                failed.append(f"{task} raised {outcome.ename}")
            elif outcome.status == "died":
                failed.append(f"{task} died")
            elif outcome.status == "interrupted":
                failed.append(f"{task} interrupted")
            elif outcome.status == "stopped":
                failed.append(f"{task} stopped with its cluster")
            elif outcome.status == "running":
                failed.append(f"{task} still running")
        return failed

    def _follow_events(self, sigint: list, say: Callable[[str], str]) -> None:
        import queue as _queue

        interrupted_at = None
        checked, stopped_since = time.monotonic(), None
        while True:
            if sigint[0] and interrupted_at is None:
                self.interrupt()
                interrupted_at = time.monotonic()
                print("Interrupting the tasks' cells ...", file=sys.stderr)
            try:
                task, kind, payload = self.events.get(timeout=0.1)
            except _queue.Empty:
                if self.done and self.events.empty():
                    break
                if time.monotonic() - checked > 1.0:  # a task stopped from outside mid-cell
                    checked = time.monotonic()
                    stuck = [
                        t
                        for t, o in self.outcomes.items()
                        if not o.done and self.cluster.condition(t).startswith("stopped")
                    ]
                    stopped_since = (stopped_since or checked) if stuck else None
                    if stuck and checked - stopped_since > 3:
                        print(
                            f"{', '.join(stuck)} is stopped (SIGSTOP): its cell goes on when it is continued; "
                            "not waiting for it here.",
                            file=sys.stderr,
                        )
                        break
                if interrupted_at is not None and time.monotonic() - interrupted_at > 10:
                    print(
                        "Some tasks did not stop within 10 s of the interrupt; they go on in the background.",
                        file=sys.stderr,
                    )
                    break
                continue
            if kind == "stream":
                name, text = payload
                stream = sys.stderr if name == "stderr" else sys.stdout
                for piece in text.splitlines(True):
                    stream.write(f"[{task}] {piece}")
                stream.flush()
            elif kind == "interrupted":  # where it was, not the whole traceback
                where = [ln.strip() for ln in payload.traceback if ln.strip().startswith("File ")]
                at = where[-1].split(", in ")[0].replace("File ", "") if where else ""
                print(f"[{task}] interrupted" + (f" at {at}" if at else ""), file=sys.stderr)
            elif kind == "error":
                print(
                    "".join(f"[{task}] {ln}" for ln in "".join(payload.traceback).splitlines(True)),
                    file=sys.stderr,
                    end="",
                )
                said = doctor.translate("".join(payload.traceback))
                if said:
                    print(f"[{task}] in words: {said}", file=sys.stderr)
            elif kind == "died":
                detail = payload.evalue if hasattr(payload, "evalue") else payload
                print(f"[{task}] {detail}; see " + say(f"cluster.logs('{task}')"), file=sys.stderr)
            elif kind == "stopped":
                print(f"[{task}] {payload.evalue}", file=sys.stderr)

    @property
    def results(self) -> dict[str, object]:
        """Each task's value of the cell's last expression (None where there was none)."""
        return {t: o.result for t, o in self.outcomes.items()}

    def __repr__(self) -> str:
        states = ", ".join(f"{t}: {o.status}" for t, o in self.outcomes.items())
        return f"<PxRun {self.name}: {states}>"


#: cells sent and not yet finished everywhere; a task runs its cells one after another
_ACTIVE: weakref.WeakSet[PxRun] = weakref.WeakSet()
_ACTIVE_LOCK = threading.Lock()


def busy_with(cluster, task: TaskName) -> PxRun | None:
    """The earlier cell ``task`` (its current process) is still running, if any."""
    proc = cluster.procs.get(task)
    with _ACTIVE_LOCK:
        runs = list(_ACTIVE)
    for run in runs:
        outcome = run.outcomes.get(str(task))
        if (
            run.cluster is cluster
            and outcome is not None
            and not outcome.done
            and run._procs.get(str(task)) is proc
        ):
            return run
    return None


def run_px(cluster, code: str, targets: str | None = "all", name: str | None = None) -> PxRun:
    """Send ``code`` to the chosen tasks and return the running :class:`PxRun`.

    A task that cannot run it now (stopped with SIGSTOP, not answering) is
    refused here, by name, instead of leaving the cell waiting for it.
    """
    chosen = parse_targets(cluster, targets)
    shared = [t for t in chosen if getattr(cluster.procs.get(t), "shared_with", None)]
    if shared:
        t = shared[0]
        raise PxError(
            f"{t} shares process {cluster.procs[t].pid} with other tasks (processes=), and a %%tf_px cell "
            "needs a process per task (its namespace, its output, its interrupt); start the cluster "
            "without processes= to run cells on its tasks"
        )
    stuck = [(t, c) for t in chosen if (c := cluster.condition(t)).startswith(("stopped", "not answering"))]
    if stuck:
        t, c = stuck[0]
        raise PxError(
            f"{t} is {c} and cannot run the cell now; continue it (kill -CONT), or restart it "
            f"(cluster.restart('{t}', force=True)), or leave it out with targets="
        )
    for t in chosen:
        earlier = busy_with(cluster, t)
        if earlier is not None:  # the task would queue this cell behind it, and the cell would print nothing
            raise PxError(
                f"{t} is still running an earlier cell ({earlier.name}, going on in the background); "
                "wait for it or interrupt it (its PxRun's wait() or interrupt()), restart the task "
                f"(cluster.restart('{t}', force=True)), or leave it out with targets="
            )
    return PxRun(cluster, code, chosen, name=name).start()
