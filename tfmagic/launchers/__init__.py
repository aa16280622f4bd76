"""Launchers start task processes somewhere; the cluster tells them what to be.

Every launcher (local, SSH, Spark; an attached cluster's stand-in) hands
back :class:`~tfmagic.launchers.base.TaskHandle` objects behind one small
contract (:class:`~tfmagic.launchers.base.Launcher`), so the cluster, the
spare pool and the magics never care where a task runs.  The modules:

* ``base``: the contract and the handle protocol;
* ``channel``: :class:`TaskProcess`, a task reached through a byte channel;
* ``process``: child-process plumbing that ``local`` and ``ssh`` share;
* ``local``, ``ssh``, ``spark`` (+ ``spark_task``, the executor side), ``attached``.
"""

from .base import Launcher, TaskHandle, TaskState
from .channel import TaskProcess
from .local import LocalLauncher

__all__ = ["Launcher", "LocalLauncher", "TaskHandle", "TaskProcess", "TaskState"]
