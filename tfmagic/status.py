"""A cluster's status as data, rendered as an HTML table or as text.

``ClusterStatus`` is what ``cluster.status()`` returns: a list of rows that a
script can read, which shows itself as an HTML table in a notebook
(``_repr_html_``) and as aligned text in a terminal (``__str__``).
"""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field

from .errors import UnknownTask
from .units import human_bytes, human_seconds


@dataclass
class TaskStatus:
    task: str
    address: str
    pid: int | None
    state: str
    cpu_percent: float | None = None
    pss: int | None = None
    rss: int | None = None
    uptime_s: float | None = None
    host: str = "127.0.0.1"
    note: str = ""
    slowness: float = 1.0

    def cells(self) -> list[str]:
        return [
            self.task,
            self.address,
            self.host,
            str(self.pid) if self.pid else "-",
            self.state,
            "-" if self.cpu_percent is None else f"{self.cpu_percent:.0f}%",
            human_bytes(self.pss),
            human_bytes(self.rss),
            human_seconds(self.uptime_s),
            self.note,
        ]


HEADERS = ["task", "address", "host", "pid", "state", "CPU", "PSS", "RSS", "uptime", "note"]


@dataclass
class ClusterStatus:
    name: str
    shape: str
    tasks: list[TaskStatus] = field(default_factory=list)
    spares: list[TaskStatus] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __iter__(self):
        return iter(self.tasks)

    def __len__(self) -> int:
        return len(self.tasks)

    def __getitem__(self, task: str) -> TaskStatus:
        for row in self.tasks:
            if row.task == str(task):
                return row
        raise UnknownTask(
            f"no task {task} in this status; its tasks are {', '.join(r.task for r in self.tasks)}"
        )

    @property
    def total_pss(self) -> int:
        """Each process once: tasks that share a process (``processes=``) show its PSS on every row."""
        per_process = {
            (r.host, r.pid) if r.pid is not None else id(r): r.pss or 0 for r in self.tasks + self.spares
        }
        return sum(per_process.values())

    def as_dicts(self) -> list[dict]:
        return [asdict(r) for r in self.tasks + self.spares]

    def _rows(self) -> list[list[str]]:
        return [r.cells() for r in self.tasks + self.spares]

    def __str__(self) -> str:
        rows = [HEADERS] + self._rows()
        widths = [max(len(r[i]) for r in rows) for i in range(len(HEADERS))]
        lines = [f"cluster {self.name}: {self.shape}"]
        for r in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        lines.append(f"memory (PSS) of tasks and spares: {human_bytes(self.total_pss)}")
        lines.extend(self.notes)
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle) -> None:  # IPython terminal
        p.text(str(self))

    def _repr_html_(self) -> str:
        esc = html.escape
        head = "".join(f"<th style='text-align:left'>{esc(h)}</th>" for h in HEADERS)
        body = []
        for row, cells in zip(self.tasks + self.spares, self._rows()):
            # by the state's first word: "exited (-9)" is red as "exited" is
            colour = {"running": "#1a7f37", "failed": "#cf222e", "exited": "#cf222e"}.get(
                row.state.split(" ")[0], "#6e7781"
            )
            tds = []
            for header, c in zip(HEADERS, cells):
                style = f" style='color:{colour};font-weight:600'" if header == "state" else ""
                tds.append(f"<td{style}>{esc(c)}</td>")
            body.append("<tr>" + "".join(tds) + "</tr>")
        notes = "".join(f"<div style='color:#6e7781'>{esc(n)}</div>" for n in self.notes)
        return (
            f"<div class='tfmagic-status'><b>cluster {esc(self.name)}</b>: {esc(self.shape)}"
            f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
            f"<div>memory (PSS) of tasks and spares: {esc(human_bytes(self.total_pss))}</div>{notes}</div>"
        )
