"""What training did, step by step: thread-safe records, no UI.

The training engine (and ``%%tf_px`` cells that report steps) append
:class:`StepRecord` s, :class:`GlobalStep` s and :class:`~tfmagic.events.Event` s
to a :class:`History`; the dashboard, TensorBoard writers and notebooks read
it, or follow ``history.feed`` (every item as it is added).  Everything here
is plain Python so it can be tested and used without TensorFlow or widgets.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from .events import Event, Topic
from .spec import TaskName

__all__ = ["Evaluation", "Event", "GlobalStep", "History", "StepRecord"]


@dataclass
class StepRecord:
    """One worker step.

    ``step`` is the global step whose parameters the worker read; ``applied``
    says whether its gradient changed the model (async: always; sync: if it
    was among the first ``replicas_to_aggregate``); ``staleness`` (async) is
    how many other updates landed between reading and applying.
    """

    task: TaskName
    step: int
    start: float
    end: float
    loss: float
    mode: str = "async"
    local_step: int = 0
    staleness: int = 0
    applied: bool = True
    dropped: bool = False
    examples: int = 0
    run: str = ""
    update: int | None = None  # the global step this gradient's update became
    rolled_back: bool = False  # its update was lost with a ps and made again after a resume
    #: where the step's time went, in seconds (None: not measured): computing the gradient on the
    #: worker; moving tensors (parameters in, gradient out); waiting for the other workers (sync);
    #: applying the update on the ps; the engine's own share (calls, threads, this process)
    compute: float | None = None
    transfer: float | None = None
    wait: float | None = None
    apply: float | None = None
    engine: float | None = None
    #: a paced cluster's modelled step time (the step was made to last that long)
    paced: float | None = None
    #: the run's first steps (tracing, first connections): shown apart, not counted in throughput
    warmup: bool = False

    def __post_init__(self) -> None:
        self.task = TaskName.parse(self.task)

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class GlobalStep:
    """One update of the shared model (sync: after aggregation)."""

    step: int
    time: float
    loss: float
    aggregated: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    run: str = ""


@dataclass
class Evaluation:
    """The loss on held-out examples after ``step`` updates: the same measure for every mode."""

    step: int
    time: float
    loss: float
    run: str = ""


class History:
    """Everything one training run recorded.  Safe to read while it grows.

    >>> h = History(mode="async")
    >>> h.add_step(StepRecord("worker:0", 0, 0.0, 0.5, 1.0, examples=32))
    >>> h.throughput()["worker:0"]["steps_per_s"]
    2.0
    """

    def __init__(self, mode: str, run: str = "", workers: Iterable[str] = ()) -> None:
        self.mode = mode
        self.run = run or mode
        self.workers = list(workers)
        self.records: list[StepRecord] = []
        self.global_steps: list[GlobalStep] = []
        #: updates lost with a ps after its last checkpoint, and made again after resume()
        self.rolled_back: list[GlobalStep] = []
        #: (update, time, loss on the same held-out examples): the one measure every mode shares
        self.evals: list[tuple[int, float, float]] = []
        self.events: list[Event] = []
        self.started_at = time.time()
        self.ended_at: float | None = None
        #: when the warm-up steps ended (None: not marked); throughput is measured from then
        self.warmup_ended_at: float | None = None
        self.final_loss: float | None = None  # on held-out data
        self.final_loss_label = "held-out loss"  # what final_loss was measured on
        self.final_accuracy: float | None = None
        self.error: str | None = None
        self.checkpoint: str | None = None
        self.config: dict = {}
        #: what the reader must know to trust the figures (a pace the machine could not keep, ...)
        self.notes: list[str] = []
        #: updates the ps applied whose records died with the worker that made them (killed before
        #: its ring of step records was read): counted, never made up
        self.unrecorded = 0
        #: where the run put its variables: (name, task, shape, dtype, bytes), for the placement map
        self.layout: list[tuple[str, str, tuple, str, int]] = []
        self._lock = threading.Lock()
        #: every StepRecord, GlobalStep and Event as it is added
        self.feed: Topic[StepRecord | GlobalStep | Event] = Topic(f"history {self.run}")

    # -- writing (engine threads) -------------------------------------------
    def add_step(self, record: StepRecord) -> None:
        record.run = record.run or self.run
        with self._lock:
            self.records.append(record)
        self.feed.publish(record)

    def add_global(self, gstep: GlobalStep) -> None:
        """Record an update; ``global_steps`` stays in step order.

        Async workers report their updates in batches, so they arrive out of
        order; kept sorted, ``global_steps[-1]`` is always the latest update.
        """
        gstep.run = gstep.run or self.run
        with self._lock:
            gs = self.global_steps
            if not gs or gs[-1].step <= gstep.step:
                gs.append(gstep)
            else:
                bisect.insort(gs, gstep, key=lambda g: g.step)
        self.feed.publish(gstep)

    def add_event(
        self,
        kind: str | Event,
        task: TaskName | str | None = None,
        detail: str = "",
        step: int | None = None,
        when: float | None = None,
    ) -> Event:
        """Record an event (or an :class:`Event` made elsewhere, e.g. by the cluster) for this run."""
        if isinstance(kind, Event):
            e = kind
            event = Event(e.time, e.kind, e.task, e.detail, e.step if step is None else step, self.run)
        else:
            event = Event(when or time.time(), kind, task or None, detail, step, self.run)
        with self._lock:
            self.events.append(event)
        self.feed.publish(event)
        return event

    def add_eval(self, step: int, when: float, loss: float) -> None:
        """The loss on the run's held-out probe examples after ``step`` updates (see TrainingRun)."""
        with self._lock:
            self.evals.append((step, when, loss))
        self.feed.publish(Evaluation(step, when, loss, self.run))

    def rollback(self, step: int) -> int:
        """Updates after ``step`` were lost (a ps died after its last checkpoint): mark them.

        Their worker steps stay in ``records`` with ``rolled_back=True`` (they
        happened, and took time); their updates move from ``global_steps`` to
        ``rolled_back``, so each step number counts once when it is made
        again.  Returns how many updates were rolled back.
        """
        with self._lock:
            undone = [g for g in self.global_steps if g.step > step]
            self.global_steps = [g for g in self.global_steps if g.step <= step]
            self.rolled_back.extend(undone)
            for r in self.records:
                made = r.update if r.update is not None else (r.step + 1 if r.applied else None)
                if made is not None and made > step and not r.rolled_back:
                    r.rolled_back = True
        return len(undone)

    # -- reading -------------------------------------------------------------
    def snapshot(self) -> tuple[list[StepRecord], list[GlobalStep], list[Event]]:
        with self._lock:
            return list(self.records), list(self.global_steps), list(self.events)

    @property
    def steps(self) -> int:
        """Global updates applied so far."""
        with self._lock:
            return len(self.global_steps)

    @property
    def latest_loss(self) -> float | None:
        """The loss of the latest update, or None before the first (no copy of the history)."""
        with self._lock:
            return self.global_steps[-1].loss if self.global_steps else None

    @property
    def done(self) -> bool:
        return self.ended_at is not None

    def by_task(self) -> dict[str, list[StepRecord]]:
        out: dict[str, list[StepRecord]] = defaultdict(list)
        for r in self.snapshot()[0]:
            out[r.task].append(r)
        return dict(out)

    def throughput(self, since: float | None = None) -> dict[str, dict[str, float]]:
        """Steps/s and examples/s per task (and ``total``), over each task's active time."""
        out: dict[str, dict[str, float]] = {}
        total_steps = total_examples = 0
        first, last = None, None
        for task, recs in sorted(self.by_task().items()):
            recs = [r for r in recs if not r.warmup]
            if since is not None:
                recs = [r for r in recs if r.end >= since]
            if not recs:
                continue
            t0 = min(r.start for r in recs)
            t1 = max(r.end for r in recs)
            span = max(t1 - t0, 1e-9)
            ex = sum(r.examples for r in recs)
            out[task] = {"steps": len(recs), "steps_per_s": len(recs) / span, "examples_per_s": ex / span}
            total_steps += len(recs)
            total_examples += ex
            first = t0 if first is None else min(first, t0)
            last = t1 if last is None else max(last, t1)
        if first is not None:
            span = max(last - first, 1e-9)
            out["total"] = {
                "steps": total_steps,
                "steps_per_s": total_steps / span,
                "examples_per_s": total_examples / span,
            }
        return out

    def breakdown(self) -> list[dict]:
        """Where each worker's step time went: mean seconds per step, and shares of the step.

        One row per task (and ``total``): ``compute`` (the gradient, on the
        worker), ``transfer`` (parameters in, gradient out), ``wait`` (for
        the other workers: sync's barrier), ``apply`` (the update on the ps),
        ``engine`` (tfmagic's own calls and threads) and, on a paced cluster,
        ``paced`` (the time waited out so the step lasts its modelled time).
        Warm-up steps are left out.
        """
        parts = ("compute", "transfer", "wait", "apply", "engine", "paced_wait")
        rows: dict[str, dict] = {}
        for r in self.snapshot()[0]:
            if r.warmup or r.compute is None:
                continue
            for key in (r.task, "total"):
                row = rows.setdefault(key, dict.fromkeys(parts, 0.0) | {"task": key, "steps": 0, "step": 0.0})
                row["steps"] += 1
                row["step"] += r.duration
                measured = 0.0
                for part in parts[:-1]:
                    value = getattr(r, part) or 0.0
                    row[part] += value
                    measured += value
                if r.paced is not None:
                    row["paced_wait"] += max(0.0, r.duration - measured)
        out = []
        for key in sorted(rows, key=lambda k: (k == "total", k)):
            row = rows[key]
            n = row["steps"]
            for part in (*parts, "step"):
                row[part] /= n
            out.append(row)
        return out

    def breakdown_table(self) -> str:
        """:meth:`breakdown` as text: milliseconds per step and each part's share."""
        lines = [
            f"{'task':9s} {'steps':>6s} {'step ms':>8s}  compute  transfer   wait    apply   engine  paced"
        ]
        for row in self.breakdown():
            step = row["step"] or 1e-12
            cells = "  ".join(
                f"{row[p] * 1000:5.1f}={row[p] / step:4.0%}"[:14].rjust(7)
                for p in ("compute", "transfer", "wait", "apply", "engine", "paced_wait")
            )
            lines.append(f"{row['task']:9s} {row['steps']:6d} {row['step'] * 1000:8.1f}  {cells}")
        return "\n".join(lines)

    def dropped(self) -> dict[str, int]:
        """Gradients dropped as stale, per task (sync with backup workers)."""
        out: dict[str, int] = defaultdict(int)
        for r in self.snapshot()[0]:
            if r.dropped:
                out[r.task] += 1
        return dict(out)

    def staleness(self) -> dict[str, float]:
        """Mean staleness per task (async)."""
        out = {}
        for task, recs in self.by_task().items():
            applied = [r.staleness for r in recs if r.applied]
            if applied:
                out[task] = sum(applied) / len(applied)
        return out

    def loss_curve(self) -> list[tuple[int, float, float]]:
        """(global step, seconds since start, loss) of every update, in step order."""
        return [(g.step, g.time - self.started_at, g.loss) for g in self.snapshot()[1]]

    def updates_per_s(self) -> float:
        """Global updates per second of training, warm-up left out (from its end to the last update).

        The first steps of a run trace its functions and make its first
        connections; counted, they made sync (which runs first in a
        comparison) look several times slower than it is.
        """
        g = self.snapshot()[1]
        since = self.warmup_ended_at or self.started_at
        g = [x for x in g if x.time > since] if self.warmup_ended_at else g
        if not g:
            return 0.0
        return len(g) / max(max(x.time for x in g) - since, 1e-9)

    def examples_seen(self) -> int:
        """Examples the workers consumed, every step counted (dropped gradients and warm-up too).

        A sync update of N workers consumes N batches, an async one one batch:
        comparing modes per update without this compares unequal work.
        """
        return sum(r.examples for r in self.snapshot()[0])

    @property
    def warmup_s(self) -> float | None:
        """Seconds the run spent warming up (tracing, first connections), shown apart from training."""
        return None if self.warmup_ended_at is None else self.warmup_ended_at - self.started_at

    def mean_step_time(self, last: int | None = None) -> float | None:
        """Mean wall time between global updates (the last ``last`` of them)."""
        times = sorted(x.time for x in self.snapshot()[1])
        if last:
            times = times[-(last + 1) :]
        if len(times) < 2:
            return None
        return (times[-1] - times[0]) / (len(times) - 1)

    def median_step_time(self) -> float | None:
        """Median wall time between global updates.

        A stall of the whole machine (another program, a GC pause) lengthens
        a few intervals: it moves the mean, hardly the median.
        """
        times = sorted(x.time for x in self.snapshot()[1])
        if len(times) < 2:
            return None
        gaps = sorted(b - a for a, b in zip(times, times[1:]))
        mid = len(gaps) // 2
        return gaps[mid] if len(gaps) % 2 else (gaps[mid - 1] + gaps[mid]) / 2

    def as_dict(self) -> dict:
        recs, gsteps, events = self.snapshot()
        return {
            "mode": self.mode,
            "run": self.run,
            "records": [asdict(r) for r in recs],
            "global_steps": [asdict(g) for g in gsteps],
            "events": [asdict(e) for e in events],
            "final_loss": self.final_loss,
            "final_loss_label": self.final_loss_label,
            "final_accuracy": self.final_accuracy,
            "error": self.error,
        }

    def summary(self) -> str:
        tp = self.throughput()
        lines = [
            f"{self.run}: {self.steps} updates"
            + (f" recorded, {self.steps + self.unrecorded} applied" if self.unrecorded else "")
            + (f", {self.final_loss_label} {self.final_loss:.4f}" if self.final_loss is not None else "")
            + (f", accuracy {self.final_accuracy:.3f}" if self.final_accuracy is not None else "")
            + (f" (stopped: {self.error})" if self.error else "")
        ]
        drops, stale = self.dropped(), self.staleness()
        for task, row in tp.items():
            extra = ""
            if task in drops:
                extra += f", {drops[task]} dropped as stale"
            if task in stale and self.mode == "async":
                extra += f", mean staleness {stale[task]:.2f}"
            lines.append(
                f"  {task:9s} {row['steps']:5d} steps  {row['steps_per_s']:7.1f} steps/s  {row['examples_per_s']:9.0f} examples/s{extra}"
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<History {self.run}: {self.steps} updates, {len(self.records)} worker steps>"

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.summary())


def comparison_table(histories: Iterable[History]) -> str:
    """Runs side by side: updates, examples consumed, warm-up and training seconds, rates, losses.

    ``seconds`` is the training after warm-up (from its end to the last
    update); the warm-up (tracing, first connections) is its own column and
    counted in no rate.  ``examples`` is every example the workers consumed.
    """
    histories = list(histories)
    rows = ["run     updates   examples  warm-up s  seconds  updates/s  examples/s  held-out loss  accuracy"]
    for h in histories:
        tp = h.throughput().get("total", {})
        since = h.warmup_ended_at or h.started_at
        secs = max(g.time for g in h.global_steps) - since if h.global_steps else 0.0
        warm = "-" if h.warmup_s is None else f"{h.warmup_s:.1f}"
        acc = "-" if h.final_accuracy is None else f"{h.final_accuracy:.3f}"
        loss = "-" if h.final_loss is None else f"{h.final_loss:.4f}"
        rows.append(
            f"{h.run:7s} {h.steps:7d}  {h.examples_seen():9d}  {warm:>9s}  {secs:7.1f}  {h.updates_per_s():9.1f}"
            f"  {tp.get('examples_per_s', 0):10.0f}  {loss:>13s}  {acc:>8s}"
        )
    labels = {h.final_loss_label for h in histories} - {"held-out loss"}
    if labels:  # e.g. a KerasModel without eval_fn
        rows.append(f"(the loss column is the {', '.join(sorted(labels))})")
    return "\n".join(rows)
