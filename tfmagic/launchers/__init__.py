"""Launchers start task processes somewhere; the cluster tells them what to be.

Every launcher (local now; SSH and Spark are siblings behind the same
contract) produces :class:`~tfmagic.launchers.base.TaskProcess` handles that
speak :mod:`tfmagic.protocol`, so the cluster, the spare pool and the magics
never care where a task runs.
"""

from .base import Launcher, TaskProcess, TaskState
from .local import LocalLauncher

__all__ = ["Launcher", "LocalLauncher", "TaskProcess", "TaskState"]
