"""The dashboard's HTML panes: the header (each run's state), the hang doctor's banner, the task table, traffic.

The task table is built from the cluster's own status rows
(:meth:`tfmagic.cluster.Cluster.status`), so a task's state is what
``%tf_cluster status`` says, with what the dashboard adds: each worker's
rate and what it is doing.  Memory is read every ``memory_every`` seconds per
task, not every frame: reading a process's PSS walks every mapping it has
(146 ms a frame for three tasks when it was read each time, and it slowed the
training it watched).
"""

from __future__ import annotations

import html
import time

from ..dashdata import STALE_MODES
from ..units import human_bytes


def _table(head: tuple[str, ...], rows: list[list[str]], right: tuple[int, ...] = ()) -> str:
    th = "".join(f"<th style='text-align:left;padding:0 8px'>{h}</th>" for h in head)
    body = "".join(
        "<tr>"
        + "".join(
            f"<td style='padding:0 8px{';text-align:right' if i in right else ''}'>{c}</td>"
            for i, c in enumerate(r)
        )
        + "</tr>"
        for r in rows
    )
    return f"<table><tr>{th}</tr>{body}</table>"


class Panes:
    """The HTML around the picture, for one dashboard (``view``: its cluster, traces, rates, meter)."""

    def __init__(self, view, memory_every: float = 15.0) -> None:
        self.view = view
        #: seconds between memory (PSS) reads of each task
        self.memory_every = memory_every
        self._memory: dict = {}  # task -> (when, pid, {"rss", "pss"})
        self._diagnosis: tuple[float, str] = (0.0, "")  # (when, the hang doctor's banner)

    # -- the task table ------------------------------------------------------------
    def _due(self, cluster, now: float) -> list[str]:
        """The tasks whose memory is read this frame (never read, a new process, or read long ago)."""
        due = []
        for task, proc in list(cluster.procs.items()):
            cached = self._memory.get(str(task))
            if cached is None or now - cached[0] > self.memory_every or cached[1] != proc.task_pid:
                due.append(str(task))
        return due

    def table_html(self) -> str:
        """The cluster table: state, pid, CPU, memory, slowness, what each task does."""
        cluster = self.view.cluster
        rows = []
        now = time.time()
        if cluster is not None:
            running = cluster.cluster_def is not None
            due = self._due(cluster, now) if running else []
            status = cluster.status(memory=due, spares=False) if running else None
            for row in status.tasks if status is not None else []:
                if row.task in due:
                    self._memory[row.task] = (now, row.pid, {"rss": row.rss, "pss": row.pss})
                memory = self._memory.get(row.task, (0, None, {}))[2]
                rate = self.view.rates.rate(row.task, now)
                alive = not row.state.startswith("exited")
                if not alive:
                    doing = "gone"
                elif row.task.startswith("ps:"):
                    doing = "holding variables"
                elif rate > 0:
                    doing = f"training, {rate:.0f} steps/s"
                else:
                    doing = "idle"
                rows.append(
                    [
                        row.task,
                        row.state,
                        str(row.pid or "-"),
                        "-" if row.cpu_percent is None or not alive else f"{row.cpu_percent:.0f}%",
                        human_bytes(memory.get("rss")) if alive and memory.get("rss") else "-",
                        human_bytes(memory.get("pss")) if alive and memory.get("pss") else "-",
                        f"x{row.slowness:g}" if row.slowness != 1.0 else "-",
                        doing,
                    ]
                )
            state = f"cluster {cluster.name}: {cluster.shape.describe()}" + ("" if running else " (stopped)")
        else:
            state = "no cluster"
        head = ("task", "state", "pid", "CPU", "RSS", "PSS", "slowed", "doing")
        table = _table(head, [[html.escape(c) for c in r] for r in rows])
        return f"<div class='tfmagic-cluster'><b>{html.escape(state)}</b>{table}</div>" + self.traffic_html()

    # -- the header and the banner ------------------------------------------------------
    def header_html(self) -> str:
        parts = []
        for tr in self.view.traces:
            h = tr.history
            state = "done" if h.done else "training"
            if h.error:
                state = "stopped"
            extra = f", {tr.dropped} dropped" if tr.dropped else ""
            loss = f", loss {h.global_steps[-1].loss:.4f}" if h.global_steps else ""
            if tr.last_eval is not None:
                loss += f", held-out {tr.last_eval[1]:.4f}"
            mean = tr.stale.mean() if tr.mode in STALE_MODES else None
            if mean is not None:
                hint = f" (workers - 1 = {len(h.workers) - 1})" if len(h.workers) > 1 else ""
                loss += f", mean staleness {mean:.2f}{hint}"
            warm = getattr(h, "warmup_s", None)
            seen = f", {tr.examples:,} examples" if tr.examples else ""
            seen += f", warm-up {warm:.1f} s" if warm is not None else ""
            parts.append(f"<b>{html.escape(tr.name)}</b>: {state}, {tr.updates} updates{seen}{loss}{extra}")
        if not parts:
            parts.append("no training run yet")
        banner = self.banner()
        shown = (
            f"<div class='tfmagic-banner' style='background:#fde2e1;padding:2px 6px'>&#9888; {html.escape(banner)}</div>"
            if banner
            else ""
        )
        pace = self.view.pace_note()
        if pace:
            parts.append(f"<span style='color:#777'>{html.escape(pace)}</span>")
        return shown + "<div class='tfmagic-header'>" + " &nbsp;|&nbsp; ".join(parts) + "</div>"

    def banner(self) -> str:
        """The hang doctor's line while something has waited more than 2 s on this cluster, else ''.

        Free while nothing waits (one look at the wait registry); while
        something does, the doctor is asked at most once a second.
        """
        from .. import doctor

        cluster = self.view.cluster
        if cluster is None or not doctor.waiting(cluster):
            self._diagnosis = (0.0, "")
            return ""
        when, said = self._diagnosis
        if time.monotonic() - when >= 1.0:
            try:
                said = doctor.why(cluster).banner
            except Exception:  # noqa: BLE001 - a banner that cannot be made is left out, not raised
                said = ""
            self._diagnosis = (time.monotonic(), said)
        return said

    # -- traffic ------------------------------------------------------------------------
    def traffic_html(self) -> str:
        """Bytes per second and per worker step on every link, measured (empty when not measured)."""
        cluster = self.view.cluster
        meter = self.view.meter or (getattr(cluster, "meter", None) if cluster is not None else None)
        if meter is None:
            return ""
        now = time.time()
        steps_per_s = sum(
            self.view.rates.rate(str(t), now) for t in getattr(cluster, "procs", {}) if t.job == "worker"
        )
        rows = []
        for link in meter.links():
            if not link.bytes:
                continue
            per_step = human_bytes(link.rate / steps_per_s) if steps_per_s > 0 and link.rate > 0 else "-"
            rows.append(
                [
                    f"{html.escape(link.src)} &rarr; {html.escape(link.dst)}",
                    f"{human_bytes(link.rate)}/s",
                    per_step,
                    human_bytes(link.bytes),
                ]
            )
        if not rows:
            return ""
        head = ("link (measured: TCP counters)", "now", "per worker step", "since start")
        return f"<div class='tfmagic-traffic'>{_table(head, rows, right=(1, 2, 3))}</div>"


__all__ = ["Panes"]
