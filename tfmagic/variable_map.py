"""Where every variable lives: the placement map.

The seeds' readers ask "where do my variables live?" and TensorFlow has no
call that lists what a task holds.  tfmagic knows what went through it: the
variables this process creates on a cluster (under ``cluster.device(...)``,
so every ``%%tf_device`` cell, and the training engine's parameter store)
are noted here, weakly (a variable that is garbage-collected leaves the
map); the variables a ``%%tf_px`` cell creates inside a task are reported by
that task.  :func:`placement` puts both together per task, with each ps's
share of the bytes and a note when one ps holds most of them.
"""

from __future__ import annotations

import html
import threading
import weakref
from dataclasses import dataclass, field

from .spec import TaskName

_lock = threading.Lock()
_noted: list[tuple[weakref.ref, int, str, int | None]] = []  # (variable, cluster id, owner, task pid)


def note(variable, cluster_id: int, owner: str, task_pid: int | None = None) -> None:
    """Remember ``variable`` (created by ``owner`` on cluster ``cluster_id``) for the map."""
    try:
        ref = weakref.ref(variable)
    except TypeError:  # not weak-referenceable: nothing to note
        return
    with _lock:
        _noted.append((ref, cluster_id, owner, task_pid))
        if len(_noted) > 4096:  # drop the dead ones now and then
            _noted[:] = [n for n in _noted if n[0]() is not None]


def creator(cluster_id: int, owner: str, task_pid: int | None = None):
    """A ``tf.variable_creator_scope`` creator that notes each variable made under it."""

    def create(next_creator, **kwargs):
        v = next_creator(**kwargs)
        note(v, cluster_id, owner, task_pid)
        return v

    return create


@dataclass
class VariableRow:
    name: str
    task: TaskName
    shape: tuple
    dtype: str
    bytes: int
    owner: str

    @property
    def freed(self) -> bool:
        """A finished run's variable, shown where it was; no task holds it now."""
        return self.owner.endswith("(ended, freed)")


@dataclass
class Placement:
    """Every variable the cluster holds, per task: ``rows``, ``by_task()``, ``shares()``, a picture."""

    cluster: str
    rows: list[VariableRow] = field(default_factory=list)
    assignment: str = ""
    notes: list[str] = field(default_factory=list)
    ran_steps: dict[str, int] = field(default_factory=dict)

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def by_task(self) -> dict[TaskName, list[VariableRow]]:
        out: dict[TaskName, list[VariableRow]] = {}
        for r in sorted(self.rows, key=lambda r: (r.task, -r.bytes)):
            out.setdefault(r.task, []).append(r)
        return out

    def shares(self) -> dict[TaskName, float]:
        """Each ps's share of the bytes the ps tasks hold."""
        ps = [r for r in self.rows if r.task.job == "ps" and not r.freed] or [
            r
            for r in self.rows
            if r.task.job == "ps"  # only a finished run's: its layout then
        ]
        total = sum(r.bytes for r in ps) or 1
        out: dict[TaskName, float] = {}
        for r in ps:
            out[r.task] = out.get(r.task, 0.0) + r.bytes / total
        return out

    def as_dicts(self) -> list[dict]:
        return [
            dict(name=r.name, task=r.task, shape=r.shape, dtype=r.dtype, bytes=r.bytes, owner=r.owner)
            for r in self.rows
        ]

    def __str__(self) -> str:
        from .units import human_bytes

        lines = [f"placement of cluster {self.cluster}: {len(self.rows)} variables"]
        shares = self.shares()
        for task, rows in self.by_task().items():
            total = sum(r.bytes for r in rows)
            share = f", {shares[task]:.0%} of the ps bytes" if task in shares else ""
            lines.append(f"  {task}: {len(rows)} variables, {human_bytes(total)}{share}")
            for r in rows:
                lines.append(
                    f"    {r.name:24s} {str(list(r.shape)):14s} {r.dtype:8s} {human_bytes(r.bytes):>8s}  {r.owner}"
                )
        if self.ran_steps:
            lines.append("  steps run: " + ", ".join(f"{t} {n}" for t, n in sorted(self.ran_steps.items())))
        if self.assignment:
            lines.append(f"  {self.assignment}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(str(self))

    def figure(self):
        """Tasks as boxes, their variables inside, heights sized by bytes (matplotlib, Agg)."""
        from matplotlib.figure import Figure
        from matplotlib.patches import Rectangle

        groups = self.by_task()
        fig = Figure(figsize=(max(4, 2.2 * max(1, len(groups))), 3.6), dpi=80)
        ax = fig.subplots()
        biggest = max([sum(r.bytes for r in rows) for rows in groups.values()] + [1])
        for i, (task, rows) in enumerate(groups.items()):
            x = i * 1.3
            ax.add_patch(Rectangle((x, 0), 1.0, 1.0, fill=False, lw=1.5, ec="#444"))
            ax.text(x + 0.5, 1.04, task, ha="center", va="bottom", fontsize=9, weight="bold")
            y = 0.0
            for j, r in enumerate(rows):
                h = r.bytes / biggest
                ax.add_patch(Rectangle((x + 0.05, y), 0.9, h, color=f"C{j % 10}", alpha=0.7))
                if h > 0.06:
                    ax.text(x + 0.5, y + h / 2, r.name, ha="center", va="center", fontsize=7)
                y += h
        ax.set_xlim(-0.2, 1.3 * max(1, len(groups)))
        ax.set_ylim(0, 1.15)
        ax.axis("off")
        ax.set_title("where the variables live (height: bytes)", fontsize=10)
        from .figcheck import checked

        return checked(fig, "the placement figure")

    def _repr_html_(self) -> str:
        import base64

        from .plots import png_bytes
        from .units import human_bytes

        png = base64.b64encode(png_bytes(self.figure())).decode()
        body = "".join(
            f"<tr><td>{html.escape(r.task)}</td><td><code>{html.escape(r.name)}</code></td>"
            f"<td>{list(r.shape)}</td><td>{r.dtype}</td><td>{human_bytes(r.bytes)}</td><td>{html.escape(r.owner)}</td></tr>"
            for rows in self.by_task().values()
            for r in rows
        )
        notes = "".join(f"<div><b>note:</b> {html.escape(n)}</div>" for n in self.notes)
        return (
            f"<div class='tfmagic-placement'><img src='data:image/png;base64,{png}'/>"
            f"<table><tr><th>task</th><th>variable</th><th>shape</th><th>dtype</th><th>bytes</th><th>made by</th></tr>"
            f"{body}</table><div>{html.escape(self.assignment)}</div>{notes}</div>"
        )


def rows_for(cluster) -> list[VariableRow]:
    """The variables this process noted on ``cluster`` that still exist, each on its task."""
    out = []
    with _lock:
        noted = [(ref(), owner, pid) for ref, cid, owner, pid in _noted if cid == cluster.id]
    for v, owner, pid in noted:
        if v is None:
            continue
        try:
            task = TaskName.parse(v.device)
        except Exception:  # noqa: BLE001 - a device string we cannot read: not on a task
            continue
        proc = cluster.procs.get(task)
        if proc is None or (pid is not None and proc.task_pid != pid):
            continue  # its task restarted (or left): the variable went with the old process
        size = int(v.dtype.size) * int(v.shape.num_elements() or 0)
        name = v.name.split(":")[0]
        out.append(VariableRow(name, task, tuple(v.shape.as_list()), v.dtype.name, size, owner))
    return out
