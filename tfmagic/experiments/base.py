"""What every experiment shares: the claim, the lab it measures in, the checks and the result.

An experiment's module only says what it measures and what would confirm the
claim (:class:`Check` s on measured figures); :class:`Lab` gives it paced
clusters, runs and the limits every experiment is held to (time, memory, a
pace the machine keeps), and :func:`conclude` turns checks and limits into a
:class:`Result` whose verdict nobody typed in.
"""

from __future__ import annotations

import base64
import contextlib
import html
import io
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TfmagicError, TrainingError, WillNotFit
from ..figcheck import checked

#: every experiment finishes within this many seconds on a 2-core machine ...
TIME_LIMIT = 150.0
#: ... in this much memory: the kernel (or script) and every task it started, PSS
MEMORY_LIMIT = 2 * 1000**3
#: the modelled machines' step time: long enough that 2 shared cores keep it with 4 workers
PACE = 0.2
#: the spread of a modelled step's time (log standard deviation): machines are not clocks
JITTER = 0.1


@dataclass(frozen=True)
class Claim:
    """A published statement and where it was published."""

    statement: str
    source: str

    def __str__(self) -> str:
        return f"{self.statement} ({self.source})"


@dataclass
class Check:
    """One measured figure against what the claim predicts for it.

    >>> Check("sync step ratio", 3.9, 3.0, ">=").passed
    True
    >>> print(Check("sync step ratio", 2.1, 3.0, ">=", "the slowed worker paces sync"))
    sync step ratio 2.1 >= 3 (the slowed worker paces sync): no
    """

    label: str
    value: float
    bound: float
    op: str = ">="
    meaning: str = ""

    @property
    def passed(self) -> bool:
        ops = {
            ">=": lambda a, b: a >= b,
            "<=": lambda a, b: a <= b,
            ">": lambda a, b: a > b,
            "<": lambda a, b: a < b,
        }
        return bool(ops[self.op](self.value, self.bound))

    def __str__(self) -> str:
        why = f" ({self.meaning})" if self.meaning else ""
        return (
            f"{self.label} {self.value:.3g} {self.op} {self.bound:.3g}{why}: {'yes' if self.passed else 'no'}"
        )


@dataclass
class Finding:
    """What an experiment's ``measure`` returns: its figures, the checks on them, a picture."""

    measured: dict
    checks: list[Check]
    figure: object | None = None
    #: what the reader should know (a phase skipped for memory, say); not a failure
    notes: list[str] = field(default_factory=list)


@dataclass
class Result:
    """One run of an experiment: the claim, the figures, the verdict and why.

    ``holds`` is True only when every check on the measured figures passed
    and the run kept its limits (time, memory, the pace); otherwise ``why``
    says what failed, in words.
    """

    name: str
    claim: Claim
    measured: dict
    holds: bool
    why: str | None
    figure: object | None
    seconds: float
    seed: int
    peak_memory: int | None = None
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return "holds" if self.holds else "does not hold"

    def text(self) -> str:
        lines = [
            f"{self.name} (seed {self.seed}): the claim {self.verdict}",
            f"  claim: {self.claim.statement}",
            f"  source: {self.claim.source}",
            "  measured: " + ", ".join(f"{k} {_fmt(v)}" for k, v in self.measured.items()),
        ]
        lines += [f"  check: {c}" for c in self.checks]
        if self.why:
            lines.append(f"  why not: {self.why}")
        lines += [f"  note: {n}" for n in self.notes]
        mem = "" if self.peak_memory is None else f", peak memory {self.peak_memory / 1e9:.2f} GB (PSS)"
        lines.append(f"  took {self.seconds:.0f} s{mem}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.text())

    def png(self) -> bytes | None:
        """The figure as PNG bytes (None without a figure)."""
        if self.figure is None:
            return None
        buf = io.BytesIO()
        self.figure.savefig(buf, format="png", bbox_inches="tight")
        return buf.getvalue()

    def _repr_html_(self) -> str:
        esc = html.escape
        color = "#2e7d32" if self.holds else "#c62828"
        rows = "".join(
            f"<tr><td>{esc(str(k))}</td><td style='text-align:right'>{esc(_fmt(v))}</td></tr>"
            for k, v in self.measured.items()
        )
        checks = "".join(
            f"<li>{'&#10003;' if c.passed else '&#10007;'} {esc(str(c).rsplit(':', 1)[0])}</li>"
            for c in self.checks
        )
        why = f"<p><b>Why not:</b> {esc(self.why)}</p>" if self.why else ""
        notes = "".join(f"<p><i>Note:</i> {esc(n)}</p>" for n in self.notes)
        png = self.png()
        img = (
            f"<img src='data:image/png;base64,{base64.b64encode(png).decode()}' style='max-width:100%'/>"
            if png
            else ""
        )
        mem = "" if self.peak_memory is None else f", peak memory {self.peak_memory / 1e9:.2f} GB"
        return (
            f"<div><h4 style='margin:0'>{esc(self.name)} (seed {self.seed}): "
            f"<span style='color:{color}'>the claim {self.verdict}</span></h4>"
            f"<p><b>Claim:</b> {esc(self.claim.statement)}<br/><b>Source:</b> {esc(self.claim.source)}</p>"
            f"<table>{rows}</table><ul>{checks}</ul>{why}{notes}{img}"
            f"<p style='color:#666'>took {self.seconds:.0f} s{mem}</p></div>"
        )


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_fmt(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


# -- memory ---------------------------------------------------------------------------------------
def _pss(pid: int) -> int:
    """A process's proportional set size in bytes (0 if it is gone or unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def memory_now(pid: int | None = None) -> int:
    """PSS of a process (this one by default) and every process below it (tasks, keepers), in bytes."""
    import psutil

    try:
        root = psutil.Process(pid)
        kids = root.children(recursive=True)
    except psutil.Error:
        return 0
    return _pss(root.pid) + sum(_pss(p.pid) for p in kids)


class MemoryWatch:
    """Samples :func:`memory_now` on a thread; ``peak`` is the highest seen.

    ``pid`` is the root of the tree to watch: this process by default, or a
    callable that returns it (``None`` while it does not exist yet: a
    notebook's kernel before it starts, say).
    """

    def __init__(self, every: float = 1.0, pid: int | Callable[[], int | None] | None = None) -> None:
        self.every = every
        self.peak = 0
        self._pid = pid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tfmagic-experiment-memory", daemon=True)

    def sample(self) -> int:
        pid = self._pid() if callable(self._pid) else self._pid
        if callable(self._pid) and pid is None:
            return 0
        now = memory_now(pid)
        self.peak = max(self.peak, now)
        return now

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def __enter__(self) -> MemoryWatch:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(2)


# -- the lab --------------------------------------------------------------------------------------
class Lab:
    """Where an experiment measures: paced clusters, runs, progress, and its limits.

    ``lab.cluster(workers=3)`` starts a paced cluster (stopped when the block
    ends); ``lab.train(cluster, "sync", steps=40)`` trains on it and raises
    :class:`~tfmagic.errors.TrainingError` when the machine could not keep
    the pace (the figures would then teach this machine, not the claim), so
    the experiment ends with that reason.
    """

    def __init__(
        self,
        seed: int = 0,
        progress: Callable[[str], None] | None = None,
        memory: MemoryWatch | None = None,
        memory_limit: int = MEMORY_LIMIT,
    ) -> None:
        self.seed = seed
        self._progress = progress
        self.memory = memory or MemoryWatch()
        self.memory_limit = memory_limit
        self.started = time.monotonic()
        #: PSS of one task, measured on the clusters started so far (None: none yet)
        self.task_bytes: int | None = None
        self.base_bytes: int | None = None

    def progress(self, message: str) -> None:
        if self._progress is not None:
            self._progress(f"[{time.monotonic() - self.started:5.1f} s] {message}")

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def pace(
        self,
        jitter: float = JITTER,
        hiccup: float = 0.0,
        hiccup_factor: float = 5.0,
        base=PACE,
        stalls=(),
        exponential: float = 0.0,
    ):
        from ..pace import Pace

        return Pace.parse(
            base,
            exponential=exponential,
            jitter=jitter,
            hiccup=hiccup,
            hiccup_factor=hiccup_factor,
            seed=self.seed,
            stalls=tuple(stalls),
        )

    @contextlib.contextmanager
    def cluster(
        self, workers: int, ps: int = 1, processes: int | str | None = None, net: str | None = None, **pace
    ) -> Iterator:
        """A paced local cluster for the block (no warm spares: they would cost memory).

        ``processes`` puts its tasks in that many processes (``"auto"``: one per 16 tasks), as
        ``LocalCluster(processes=)`` does: how an experiment reaches 16 or 32 workers in 2 GB;
        ``net`` models its network (``"ps:* rate=2mbit"``: each ps's card), as ``LocalCluster(net=)``.
        """
        from ..cluster import LocalCluster

        shared = f" in {processes} processes" if processes is not None else ""
        self.progress(f"starting {ps} ps + {workers} worker{'s' if workers != 1 else ''} (paced){shared}")
        before = self.memory.sample()
        cluster = LocalCluster(
            ps=ps, workers=workers, spares=False, pace=self.pace(**pace), processes=processes, net=net
        )
        # a start refused (a hub's task limit: WillNotFit) or failed has stopped what it started; stopping
        # again would say "not running" instead of why
        cluster.start()
        try:
            cluster.connect()
            after = self.memory.sample()
            pids = {p.pid for p in cluster.procs.values() if p.pid}  # a shared process once
            per = [_pss(pid) for pid in pids]
            if per and all(per):
                if processes is None:  # what one task's process costs; shared ones are estimated in fits
                    self.task_bytes = max(per)
                self.base_bytes = max(0, after - sum(per))
            elif self.base_bytes is None:
                self.base_bytes = before
            yield cluster
        finally:
            cluster.stop()

    def fits(self, tasks: int, processes: int | str | None = None) -> tuple[bool, str]:
        """Whether a cluster of ``tasks`` tasks (in ``processes`` processes) stays under the memory
        limit, and the arithmetic. A process costs what one task's process measured here (or
        200 MB); each further task sharing it about 32 MB after a run
        (:data:`tfmagic.cluster.taskset.SHARED_TASK_BYTES`, ``bench/memory.py``)."""
        from ..cluster.taskset import SHARED_TASK_BYTES
        from ..launchers.local import process_sizes
        from ..procs.memory import memory_available

        per = self.task_bytes or 200 * 1000**2
        base = self.base_bytes or memory_now()
        n = len(process_sizes(tasks, processes)) if processes is not None else tasks
        # a process grows while its tasks train (measured: 1.64 GB foreseen, 1.70 used); a shared task's
        # cost was measured after a run
        need = base + n * per * 1.25 + (tasks - n) * SHARED_TASK_BYTES
        allowed = min(self.memory_limit, base + memory_available())
        cost = f"{tasks} tasks x {per / 1e9:.2f} GB x 1.25 as they train"
        if n < tasks:
            cost = (
                f"{n} process{'es' if n != 1 else ''} x {per / 1e9:.2f} GB x 1.25 as they train + "
                f"{tasks - n} tasks sharing them x {SHARED_TASK_BYTES / 1e9:.2f} GB"
            )
        words = f"{cost} + {base / 1e9:.2f} GB for this process = {need / 1e9:.2f} GB against {allowed / 1e9:.2f} GB allowed"
        return need <= allowed, words

    def train_alone(self, workers: int, steps: int, notes: list[str], processes=None, base: float = PACE):
        """An async run of ``steps`` updates on a cluster of ``workers`` of its own (at ``base`` a step).

        None when a limit the memory estimate does not know (a hub's tasks per user) refused its start:
        ``notes[-1]`` (the size's "fits" note) then says it was skipped, in that limit's words.
        """
        try:
            with self.cluster(workers=workers, processes=processes, base=base) as cluster:
                return self.train(
                    cluster, "async", steps, label=f"async, {workers} workers, {base * 1000:g} ms"
                )
        except WillNotFit as refused:
            notes[-1] = f"{workers} workers skipped: {refused}"
            self.progress(notes[-1])
            return None

    def train(self, cluster, mode: str, steps: int, label: str = "", **kwargs):
        """A run on ``cluster``; its :class:`~tfmagic.metrics.History`, or TrainingError with the reason."""
        from .. import training
        from ..training.models import Linear

        kwargs.setdefault("model", Linear(seed=self.seed))
        kwargs.setdefault("seed", self.seed)
        self.progress(f"{label or mode}: {steps} updates")
        # each run traces its step functions anew: TensorFlow's "retracing" warnings say so, not the
        # claim (set here, after TensorFlow's import, which sets its own level; conclude() restores it)
        logging.getLogger("tensorflow").setLevel(logging.ERROR)
        history = training.train(cluster, mode=mode, steps=steps, **kwargs)
        self.memory.sample()
        if history.error:
            raise TrainingError(f"the {label or mode} run failed: {history.error}")
        for note in history.notes:
            if "could not keep" in note:
                raise TrainingError(f"in the {label or mode} run, {note}")
        return history


def conclude(
    name: str,
    claim: Claim,
    seed: int,
    measure: Callable[[Lab], Finding],
    progress: Callable[[str], None] | None = None,
    memory_limit: int = MEMORY_LIMIT,
) -> Result:
    """Run ``measure`` in a fresh :class:`Lab` and judge it: checks, time, memory, pace."""
    tf_log = logging.getLogger("tensorflow")
    level = tf_log.level
    tf_log.setLevel(logging.ERROR)
    try:
        return _conclude(name, claim, seed, measure, progress, memory_limit)
    finally:
        tf_log.setLevel(level)


def _conclude(name, claim, seed, measure, progress, memory_limit) -> Result:
    with MemoryWatch() as watch:
        lab = Lab(seed, progress, watch, memory_limit)
        finding: Finding | None = None
        failure: str | None = None
        try:
            finding = measure(lab)
        except TfmagicError as exc:
            failure = str(exc)
        seconds = lab.elapsed
    peak = watch.peak
    finding = finding or Finding(measured={}, checks=[])
    reasons = [] if failure is None else [failure]
    reasons += [
        f"{c.label} was {c.value:.3g}, the claim needs {c.op} {c.bound:.3g}"
        for c in finding.checks
        if not c.passed
    ]
    if seconds > TIME_LIMIT:
        reasons.append(f"it took {seconds:.0f} s, over the {TIME_LIMIT:.0f} s every experiment must keep")
    if peak > memory_limit:
        reasons.append(
            f"it used {peak / 1e9:.2f} GB at its peak, over the {memory_limit / 1e9:.2g} GB it may use"
        )
    if failure is None and not finding.checks:
        reasons.append("nothing was measured")
    return Result(
        name=name,
        claim=claim,
        measured=finding.measured,
        holds=not reasons,
        why="; ".join(reasons) or None,
        figure=None if finding.figure is None else checked(finding.figure, f"{name}'s figure"),
        seconds=seconds,
        seed=seed,
        peak_memory=peak,
        checks=finding.checks,
        notes=finding.notes,
    )


def figure(cols: int = 2, width: float = 10.0, height: float = 3.4):
    """A matplotlib Figure (no pyplot, so no backend, safe off the main thread) and its axes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=90)
    axes = fig.subplots(1, cols)
    return fig, (list(axes) if cols > 1 else [axes])


def worker_rates(history) -> dict[str, float]:
    """Steps/s of each worker in a run, warm-up left out."""
    return {t: row["steps_per_s"] for t, row in history.throughput().items() if t != "total"}
