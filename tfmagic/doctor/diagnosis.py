"""The hang doctor: who waits on whom, since when, and why, in words, with the next step.

TensorFlow's own answer to a hang is a log line such as ``CreateSession
still waiting for response from worker: /job:worker/replica:0/task:1``, or
nothing at all.  ``cluster.why()`` reads what tfmagic knows (the waits under
way in this process, :mod:`tfmagic.doctor.waits`; each task's process state, its
channel, its port, its log) and says it the way a person would::

    a sync step of training run sync has waited 4.1 s on worker:1
    worker:1 is stopped (SIGSTOP, not by tfmagic's slow): it computes nothing until it is continued.
    Next: kill -CONT 4242, or %tf_cluster restart worker:1 --force.

With ``stacks=True`` the Python stacks of every task's threads come along
(over each task's control channel; a stopped task cannot answer, and says so).
TensorFlow's classic messages are translated by :func:`translate`, wherever
tfmagic shows them.
"""

from __future__ import annotations

import html
import re
import time
from dataclasses import dataclass, field

from ..launchers.base import TaskState
from ..network import ports
from ..protocol import Op
from ..spec import TaskName
from . import waits

#: How long something must have waited before it is reported.
THRESHOLD = 2.0

_TF_MESSAGES = [
    (
        re.compile(
            r"CreateSession still waiting for response from worker: /job:(\w+)/replica:\d+/task:(\d+)"
        ),
        lambda m: (
            f"a TF1 session waits for {m.group(1)}:{m.group(2)} to answer (it has not started, or is stuck)"
        ),
    ),
    (
        re.compile(r"Unable to find a context_id matching"),
        lambda m: (
            "a task was restarted under this connection (it forgot the client's context); connect again"
        ),
    ),
    (
        re.compile(r"Unavailable\w*[^\n]*(?:Connection refused|failed to connect to all addresses)[^\n]*"),
        lambda m: (
            f"nothing answers at {_address(m.group(0)) or 'an address of the cluster'}: "
            "that task is not running"
        ),
    ),
    (
        re.compile(r"Waiting for model to be ready\.\s+Ready_for_local_init_op:[^,]*,\s*ready: (.*)"),
        lambda m: (
            f"a non-chief session waits for the chief to initialise the variables ({m.group(1).strip()[:80]})"
        ),
    ),
    (
        re.compile(r"required incompatible device '/job:(\w+)/task:(\d+)/device:GPU:\d+'"),
        lambda m: (
            f"ops of a variable on {m.group(1)}:{m.group(2)} were put on a GPU it does not have (tfmagic "
            f"gives ps tasks CUDA_VISIBLE_DEVICES=''): replica_device_setter copies worker_device's GPU into "
            f"the ps device; pass ps_device='/job:{m.group(1)}/cpu:0', or allow_soft_placement=True "
            "in the session's ConfigProto"
        ),
    ),
    (
        re.compile(r"Waiting for model to be ready"),
        lambda m: (
            "a non-chief session waits for the chief to initialise the variables (is the chief running?)"
        ),
    ),
]


def _address(text: str) -> str:
    m = re.search(r"(?:ipv4:)?((?:\d{1,3}\.){3}\d{1,3}:\d+|localhost:\d+)", text)
    return m.group(1) if m else ""


def translate(text: str) -> str:
    """TensorFlow's messages about waiting and unreachable tasks, in words ('' when none is found)."""
    found = []
    for pattern, words in _TF_MESSAGES:
        for m in pattern.finditer(text or ""):
            said = words(m)
            if said not in found:
                found.append(said)
    return "; ".join(found)


_RUN_ID = re.compile(r" \([0-9a-f]{6,}\)$")
_NOISE = re.compile(r"^\s*([{}]|\w+\s*[{:]|\w+\s*\{)")  # protobuf dumps in TensorFlow's start-up log
#: TensorFlow's start-up lines, the same in every task: they never say why it ended
_STARTUP = re.compile(
    r"cuda|cuInit|cpu_feature_guard|absl::InitializeLog|To enable the following instructions|"
    r"rebuild TensorFlow|oneDNN custom operations|TF_ENABLE_ONEDNN_OPTS|Started server with target"
)


def meaningful_tail(log: str, lines: int = 3) -> list[str]:
    """The last ``lines`` lines of a log that say something (not the braces of a config dump)."""
    keep = [
        ln.strip()
        for ln in log.splitlines()
        if ln.strip() and not _NOISE.match(ln) and not _STARTUP.search(ln)
    ]
    return keep[-lines:]


@dataclass
class Finding:
    """One wait: ``waiter`` has waited ``since`` seconds on ``waiting_for``; ``cause`` and ``next_step`` say why."""

    waiter: str
    waiting_for: str
    since: float
    cause: str
    next_step: str = ""
    detail: str = ""

    def __post_init__(self) -> None:
        self.waiter = _RUN_ID.sub("", self.waiter)

    def __str__(self) -> str:
        what = f" ({self.detail})" if self.detail else ""
        text = f"{self.waiter}{what} has waited {self.since:.1f} s on {self.waiting_for}: {self.cause}."
        return text + (f" Next: {self.next_step}." if self.next_step else "")


@dataclass
class Diagnosis:
    """What :meth:`Cluster.why` found: ``rows`` (waiter, waiting_for, since, cause), words, stacks."""

    cluster: str
    rows: list[Finding] = field(default_factory=list)
    tasks: dict[str, str] = field(default_factory=dict)  # task -> its condition in words
    stacks: dict[str, str] = field(default_factory=dict)
    took: float = 0.0

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def text(self) -> str:
        if not self.rows:
            lines = [f"nothing has waited more than {THRESHOLD:g} s on cluster {self.cluster}"]
        else:
            lines = [str(r) for r in self.rows]
        odd = {t: c for t, c in self.tasks.items() if c != "running"}
        if odd:
            lines.append("tasks: " + "; ".join(f"{t} {c}" for t, c in odd.items()))
        for task, stack in self.stacks.items():
            lines.append(f"--- {task} ---\n{stack}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.text)

    def _repr_html_(self) -> str:
        rows = (
            "".join(
                f"<tr><td>{html.escape(r.waiter)}</td><td>{html.escape(r.waiting_for)}</td><td>{r.since:.1f} s</td>"
                f"<td>{html.escape(r.cause)}</td><td>{html.escape(r.next_step)}</td></tr>"
                for r in self.rows
            )
            or f"<tr><td colspan=5>nothing has waited more than {THRESHOLD:g} s</td></tr>"
        )
        stacks = "".join(
            f"<details><summary>{html.escape(t)}</summary><pre>{html.escape(s)}</pre></details>"
            for t, s in self.stacks.items()
        )
        return (
            "<div class='tfmagic-why'><table><tr><th>who waits</th><th>on</th><th>since</th><th>why</th>"
            f"<th>next step</th></tr>{rows}</table>{stacks}</div>"
        )

    @property
    def banner(self) -> str:
        """One line for a dashboard: the longest wait, or ''."""
        return str(self.rows[0]) if self.rows else ""


def condition(cluster, task: TaskName) -> tuple[str, str]:
    """(cause, next step) for ``task``, in words: dead, stopped, slowed, not answering, not listening, or fine."""
    procs = cluster.procs
    proc = procs.get(task)
    if proc is None:
        return ("it is not part of the running cluster", "")
    if getattr(proc, "state", None) is TaskState.KILLED:
        return (
            f"it is dead: killed on purpose, its server cut off (modelled; process {proc.pid} serves the "
            "tasks it shares)",
            f"%tf_cluster restart {task}",
        )
    if not proc.alive:
        code = proc.exit_code
        how = f"killed by signal {-code}" if isinstance(code, int) and code < 0 else f"exit code {code}"
        tail = meaningful_tail(proc.log_tail(60) or "")
        said = translate("\n".join(tail))
        last = f"; its log ends: {' | '.join(t.strip()[:120] for t in tail)}" if tail else ""
        return (f"it is dead ({how}){last}" + (f" ({said})" if said else ""), f"%tf_cluster restart {task}")
    stats = cluster.launcher.stats(proc, memory=False) if proc.pid is not None else {}
    slowed = cluster.slowness.get(task)
    if stats and stats.get("run_state") == "stopped":
        if slowed and cluster.pace is None:
            return (
                f"it is slowed x{slowed:g} by %tf_cluster slow (paused most of the time): slow, not hung",
                f"%tf_cluster slow {task} --factor 1",
            )
        return (
            "it is stopped (SIGSTOP, not by tfmagic's slow): it computes nothing until it is continued",
            f"kill -CONT {proc.task_pid}, or %tf_cluster restart {task} --force",
        )
    if slowed:
        return (
            f"it is slowed x{slowed:g} ({'modelled' if cluster.pace else 'throttled'}): slow, not hung",
            f"%tf_cluster slow {task} --factor 1",
        )
    if proc.pid is not None and not stats:
        return (
            "its process runs but does not answer tfmagic's channel (busy in a long native call, or stuck)",
            "%tf_cluster why --stacks",
        )
    shaper = getattr(cluster, "shaper", None)
    state = shaper.state() if shaper is not None and str(task) in shaper.models else "running"
    if state != "running":
        return (
            f"its network relay (pid {shaper.pid}) is {state}: nothing crosses {task}'s modelled card, "
            "though the task itself is fine",
            f"kill -CONT {shaper.pid}, or %tf_cluster restart relay"
            if state == "stopped"
            else "%tf_cluster restart relay (the task and its variables are kept)",
        )
    address = cluster.cluster_def.address(task) if cluster.cluster_def else None
    if address and not ports.port_answers(address, timeout=1.0):
        return (f"nothing listens on {address}: its server is not up", f"%tf_cluster restart {task} --force")
    return ("running", "")


#: Frames of TensorFlow's session manager while a non-chief waits for the chief
_WAITS_FOR_CHIEF = re.compile(
    r'session_manager\.py", line \d+, in (wait_for_session|_model_not_ready|_ready)'
)


def _look_inside(cluster, on, wait, waits_now) -> tuple[str, str] | None:
    """(cause, next step) for a ``%%tf_px`` cell that waits on running tasks, from their stacks
    and the cell's own objects (see :meth:`tfmagic.task.cells.Cells.hints`); None when nothing is recognised."""
    for task in on:
        proc = cluster.procs.get(task)
        if proc is None:
            continue
        try:
            reply = proc.request(Op.STACKS, timeout=1.0, hints=True)
        except Exception:  # noqa: BLE001 - a task that cannot answer is said elsewhere
            continue
        main = next((t["stack"] for t in reply.get("threads", []) if t.get("name") == "MainThread"), "")
        hints = reply.get("hints") or []
        for hint in hints:
            if "where nothing listens" in hint:
                return (
                    f"{task}: {hint}: its session waits for that address for ever",
                    "correct the address in the cell (or use the `cluster` every cell is given); an interrupt "
                    f"cannot reach a session waiting in native code: %tf_cluster restart {task} --force",
                )
        if "in complete" in main and "exec_module" in main:
            return (
                f"{task}: it is importing TensorFlow's whole Python API for its first cell (seconds, once)",
                "wait a moment",
            )
        if _WAITS_FOR_CHIEF.search(main):
            return (
                f"{task}: a TF1 non-chief session waits for the chief to initialise the variables, "
                "and the chief is not running this program",
                "run the program on the chief too (is_chief=True, usually worker:0): --targets worker:*",
            )
        for hint in hints:
            if hint.startswith("SyncReplicasOptimizer"):
                m = re.search(r"aggregates (\d+) gradients", hint)
                need = int(m.group(1)) if m else 0
                running = sum(1 for w in waits_now if w.waiter == wait.waiter)
                if need > running:
                    return (
                        f"{task}: {hint}, but only {running} worker{'s' if running != 1 else ''} "
                        "run this program: every step waits for ever",
                        f"run it on {need} workers, or set replicas_to_aggregate={running}",
                    )
    return None


def waiting(cluster, threshold: float = THRESHOLD) -> bool:
    """Whether something has waited past ``threshold`` while ``cluster`` runs: the doctor's free first
    look (one look at the wait registry), before anything asks :func:`why` for words."""
    return bool(cluster.running and waits.current(threshold))


def why(cluster, stacks: bool = False, threshold: float = THRESHOLD) -> Diagnosis:
    """See :meth:`tfmagic.cluster.Cluster.why`."""
    t0 = time.monotonic()
    diag = Diagnosis(cluster.name)
    if not cluster.running:
        replaced = getattr(cluster, "replaced_by", None)
        diag.rows.append(
            Finding(
                "this Cluster object",
                "its tasks",
                0.0,
                f"cluster {cluster.name} was {'replaced by ' + replaced if replaced else 'stopped'}: its tasks are gone",
                "use tfmagic.current_cluster() (or start it again)",
            )
        )
        diag.took = time.monotonic() - t0
        return diag
    tasks = list(cluster.procs)
    causes = {t: condition(cluster, t) for t in tasks}
    diag.tasks = {
        t: "running" if cause == "running" else cause + (f"; next: {step}" if step else "")
        for t, (cause, step) in causes.items()
    }
    waits_now = waits.current(threshold)
    for w in waits_now:
        if w.cluster is not None and w.cluster != cluster.id:
            continue
        on = [TaskName.parse(t) for t in w.on if t in causes] or []
        bad = [t for t in on if causes[t][0] != "running"]
        if not on:
            if w.cluster != cluster.id:
                continue
            diag.rows.append(
                Finding(w.waiter, "nothing any more", w.seconds, "it is finishing", "", w.detail)
            )
            continue
        if bad:
            for t in bad:
                cause, step = causes[t]
                diag.rows.append(
                    Finding(
                        w.waiter,
                        t,
                        w.seconds,
                        f"{t}: {cause}" if not cause.startswith(t) else cause,
                        step,
                        w.detail,
                    )
                )
        else:
            names = ", ".join(on)
            looked = _look_inside(cluster, on, w, waits_now) if "tf_px" in w.waiter else None
            if looked is not None:
                cause, step = looked
                diag.rows.append(Finding(w.waiter, names, w.seconds, cause, step, w.detail))
                continue
            cause = (
                f"{names} {'is' if len(on) == 1 else 'are'} running and answering: still working (a long step), "
                "or waiting in turn for another task"
            )
            step = "%tf_cluster why --stacks shows where they are"
            if w.detail.endswith("gradients so far"):
                cause = f"it has {w.detail} and waits for {names}, which {'is' if len(on) == 1 else 'are'} still computing"
            # a worker's step reads and writes the variables on every ps: one that cannot answer
            # holds the step, though the worker itself answers
            stuck_ps = [t for t in tasks if t.job == "ps" and t not in on and causes[t][0] != "running"]
            if stuck_ps and any(t.job == "worker" for t in on):
                ps = stuck_ps[0]
                cause = (
                    f"{names} {'is' if len(on) == 1 else 'are'} running, but its step needs the variables on "
                    f"{ps}: {causes[ps][0]}"
                )
                step = causes[ps][1] or step
            diag.rows.append(Finding(w.waiter, names, w.seconds, cause, step, w.detail))
    for t in tasks:  # TF1 sessions in tasks say in their logs what they wait for
        proc = cluster.procs[t]
        if not proc.alive or not hasattr(proc, "log_tail"):
            continue
        said = translate(proc.log_tail(40) or "")
        if said and "TF1 session waits for" in said:
            m = re.search(r"waits for (\w+:\d+)", said)
            other = TaskName.parse(m.group(1)) if m else None
            cause, step = (
                causes.get(other, ("not in this cluster", "check the program's cluster spec"))
                if other
                else ("", "")
            )
            diag.rows.append(
                Finding(
                    f"a TF1 session in {t}",
                    str(other),
                    0.0,
                    f"{said}; {other}: {cause}",
                    step or "start the chief's program (the task with is_chief=True)",
                )
            )
    if stacks:
        for t in tasks:
            proc = cluster.procs[t]
            try:
                reply = proc.request(Op.STACKS, timeout=2.0)
                diag.stacks[t] = "\n".join(f"[{x['name']}]\n{x['stack']}" for x in reply.get("threads", []))
            except Exception as exc:  # noqa: BLE001 - what cannot answer is said, not raised
                diag.stacks[t] = f"(no answer: {causes[t][0]}; {type(exc).__name__})"
    diag.rows.sort(key=lambda r: -r.since)
    diag.took = time.monotonic() - t0
    return diag
