"""The hang doctor and the registry it reads.

:mod:`~tfmagic.doctor.waits` is where whatever waits on a task notes it (the engine, cells, starts);
:mod:`~tfmagic.doctor.diagnosis` turns those waits and each task's state into words and a next step.
The registry sits low (the client notes its waits there); the diagnosis reads the cluster, so it sits
above it.  ``tfmagic.doctor.why`` and the rest are the diagnosis's names, kept here as before.
"""

from __future__ import annotations

from .diagnosis import THRESHOLD, Diagnosis, Finding, condition, meaningful_tail, translate, waiting, why

__all__ = ["THRESHOLD", "Diagnosis", "Finding", "condition", "meaningful_tail", "translate", "waiting", "why"]
