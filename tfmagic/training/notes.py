"""Each worker's share of a run, written into that worker's own log (``%tf_cluster logs``).

The kernel drives the steps, so without these a worker's log holds only
TensorFlow's start-up lines; the seeds read training progress there.  One
line per worker per probe (at most about 40 per run), sent without waiting:
a task that cannot take it loses the line, not the step.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ..protocol import Op

if TYPE_CHECKING:
    from .run import TrainingRun


class WorkerNotes:
    """Counts each worker's applied gradients as records arrive, and sends each its line."""

    def __init__(self, run: TrainingRun) -> None:
        self.run = run
        #: gradients applied per worker, counted as records arrive
        self.applied_by: dict[str, int] = {}
        self._counted = 0  # records counted into applied_by so far
        self._lock = threading.Lock()  # the probe thread and the run's end both write notes

    def note(self, where: str) -> None:
        """``run NAME (MODE): WHERE; N of its gradients applied`` into every live worker's log.

        Records only grow (a rollback marks them), so each note counts only the ones that arrived
        since the last: the kernel's GIL drives every step.
        """
        run = self.run
        with self._lock:
            fresh = run.history.records[self._counted :]
            self._counted += len(fresh)
            for r in fresh:
                if r.applied:
                    self.applied_by[str(r.task)] = self.applied_by.get(str(r.task), 0) + 1
            counts = dict(self.applied_by)
        for w in list(run.policy.workers.values()):
            proc = run.cluster.procs.get(w.task)
            if proc is None or w.lost or not proc.alive:
                continue
            mine = counts.get(str(w.task), 0)
            try:
                proc.send(
                    Op.NOTE, text=f"run {run.name} ({run.mode}): {where}; {mine} of its gradients applied"
                )
            except Exception:  # noqa: BLE001 - a task tfmagic did not start cannot be written to
                return


__all__ = ["WorkerNotes"]
