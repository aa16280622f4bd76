"""What the magics show: start progress, outcomes as sentences, errors in magic syntax.

The plain-Python API returns data (start outcomes, status rows) and raises
errors whose messages speak Python (``cluster.restart('worker:1', force=True)``);
a notebook user typed magics, so this module says the same things in magic
syntax (``%tf_cluster restart worker:1 --force``), in one place.
"""

from __future__ import annotations

import html
import re
import time

from .. import client
from ..cluster import Cluster, StartOutcome
from ..spec import TaskName
from ..units import human_seconds

#: Python forms in API messages -> what a notebook user types.
_MAGIC_FORMS = [
    (re.compile(r"cluster\.restart\('([^']+)', force=True\)"), r"%tf_cluster restart \1 --force"),
    (re.compile(r"cluster\.restart\('([^']+)'\)"), r"%tf_cluster restart \1"),
    (re.compile(r"cluster\.logs\('([^']+)'\)"), r"%tf_cluster logs \1"),
    (re.compile(r"cluster\.kill\('([^']+)'\)"), r"%tf_cluster kill \1"),
    (re.compile(r"cluster\.slow\('([^']+)', ([0-9.]+)\)"), r"%tf_cluster slow \1 --factor \2"),
    (re.compile(r"cluster\.why\(\)"), "%tf_cluster why"),
    (re.compile(r"cluster\.restart_relay\(\)"), "%tf_cluster restart relay"),
    (re.compile(r"cluster\.start\(\)"), "%tf_cluster start"),
    (re.compile(r"session\.stop\(\)"), "%tf_cluster stop"),
    (re.compile(r"replace=True"), "--replace"),
    (re.compile(r"Pass force=True \((%tf_cluster [^)]*)\)"), r"Run \1"),
    (re.compile(r"\(tfmagic\.LocalCluster\(\.\.\.\)\.start\(\)\)"), "(%tf_cluster start)"),
    (
        re.compile(r"wait for it or interrupt it \(its PxRun's wait\(\) or interrupt\(\)\), "),
        "wait for it to end, ",
    ),
    (re.compile(r"leave it out with targets="), "leave it out with --targets"),
]


def as_magic(message: str) -> str:
    """An API error message as a magic user reads it."""
    for pattern, replacement in _MAGIC_FORMS:
        message = pattern.sub(replacement, message)
    return message


class Cleared:
    """Replaces a progress display that turned out not to be needed."""

    def __repr__(self) -> str:
        return ""

    def _repr_html_(self) -> str:
        return ""


class StartProgress:
    """What a notebook shows while a cluster comes up: one row per task."""

    def __init__(self, tasks: list[TaskName]):
        self.rows = {t: ("waiting", "") for t in tasks}
        self.t0 = time.monotonic()
        self.title = "starting cluster"

    def update(self, task: str, stage: str, detail: str) -> None:
        if task in self.rows:
            self.rows[task] = (stage, detail)

    def __repr__(self) -> str:
        lines = [f"{self.title} ({time.monotonic() - self.t0:.1f} s)"]
        lines += [f"  {t:10s} {s:9s} {d}" for t, (s, d) in self.rows.items()]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        icon = {
            "up": "<span style='color:#1a7f37'>&#10003;</span>",
            "failed": "<span style='color:#cf222e'>&#10007;</span>",
        }
        rows = "".join(
            f"<tr><td>{icon.get(s, '&middot;')}</td><td><code>{html.escape(t)}</code></td>"
            f"<td>{html.escape(s)}</td><td>{html.escape(d)}</td></tr>"
            for t, (s, d) in self.rows.items()
        )
        return (
            f"<div><b>{html.escape(self.title)}</b> ({time.monotonic() - self.t0:.1f} s)"
            f"<table>{rows}</table></div>"
        )


def started(cluster: Cluster, outcome: StartOutcome) -> str:
    """One sentence per outcome kind."""
    if outcome.kind == "reused":
        notes = "".join(f" {n[0].upper()}{n[1:]}." for n in outcome.notes)
        return (
            f"Reusing the running cluster {cluster.name} ({cluster.shape.describe()}, up "
            f"{human_seconds(getattr(outcome, 'age_s', 0.0))}); %tf_cluster stop ends it, --replace starts a fresh one."
            + notes
        )
    how = f"{outcome.warm} warm spare{'s' if outcome.warm != 1 else ''}, {outcome.cold} new"
    head = f"Cluster {cluster.name} started: {cluster.shape.describe()} in {outcome.seconds:.1f} s ({how})."
    if cluster.pace is not None:
        head += f" Its workers are {cluster.pace.describe()} (the training engine's steps)."
    if outcome.kind == "replaced":
        head += f" It replaced the cluster that ran before ({outcome.replaced}), which was stopped."
    use = (
        "Use %%tf_px: every task has a MultiWorkerMirroredStrategy ready as `strategy`."
        if cluster.collective
        else "Use %%tf_device worker:0 to run a cell there."
    )
    return f"{head} {use}"


def security(cluster: Cluster) -> str:
    return f"Security: {cluster.launcher.security_note()}; {client.server_note()}. See docs/security.md."


_security_said: set[str] = set()


def security_once(cluster: Cluster) -> str | None:
    """:func:`security`, the first time this kernel starts a cluster whose note it is; None after.

    A lesson starts several clusters: the same paragraph under each start is
    read once and then skipped, including the time it says something new.
    """
    line = security(cluster)
    if line in _security_said:
        return None
    _security_said.add(line)
    return line
