"""Limits a hub's admin sets on each user's tfmagic: how many tasks, how much memory, in all.

On a JupyterHub every student's server runs on the hub's machines, and nothing else stops one
student from starting 20 workers and taking the memory of everyone.  The admin sets the limits
in ``jupyterhub_config.py`` (:func:`tfmagic.hub.limits`, which puts them in each single-user
server's environment); every start and every ``add`` of this user, in any of their kernels,
counts what the user's tfmagic task processes already hold on this machine and refuses in one
line, nothing started, what would go over:

* ``TFMAGIC_MAX_TASKS``: task processes (ps, workers, a shared process's tasks each count);
* ``TFMAGIC_MAX_MEMORY``: bytes (``"3 GB"``, ``"3GiB"``), the tasks' PSS now plus an estimate of
  the new ones (200 MB a task, 32 MB a task sharing a process);
* ``TFMAGIC_LIMITS_SET_BY``: who set them, for the message ("your hub's admin").

A malformed value is one line naming the variable, and no start goes ahead until it is fixed: a
limit the admin meant must not be read as none.
"""

from __future__ import annotations

import os

from ..errors import BadArgument, WillNotFit
from ..units import human_bytes, parse_bytes

ENV_TASKS = "TFMAGIC_MAX_TASKS"
ENV_MEMORY = "TFMAGIC_MAX_MEMORY"
ENV_SET_BY = "TFMAGIC_LIMITS_SET_BY"
#: a task process's command line names one of these modules
TASK_MODULES = ("tfmagic.task_main", "tfmagic.task.host")


def limits(env: dict[str, str] | None = None) -> tuple[int | None, int | None]:
    """``(max_tasks, max_bytes)`` from the environment (``None``: no limit), or one line on a bad value."""
    env = os.environ if env is None else env
    tasks = memory = None
    raw = (env.get(ENV_TASKS) or "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise BadArgument(
                f"{ENV_TASKS}={raw!r} is not a number of tasks (1 or more); ask whoever set it "
                f"({env.get(ENV_SET_BY) or 'your hub admin'}) to fix it"
            )
        tasks = int(raw)
    raw = (env.get(ENV_MEMORY) or "").strip()
    if raw:
        try:
            memory = parse_bytes(raw)
        except (ValueError, BadArgument) as exc:
            raise BadArgument(
                f"{ENV_MEMORY}={raw!r} is not an amount of memory (3 GB, 3GiB): {exc}; ask whoever set it "
                f"({env.get(ENV_SET_BY) or 'your hub admin'}) to fix it"
            ) from None
        if not isinstance(memory, int) or memory <= 0:
            raise BadArgument(f"{ENV_MEMORY}={raw!r} must be an amount of memory above 0 (3 GB)")
    return tasks, memory


def user_tasks() -> list:
    """This user's tfmagic task processes on this machine (every kernel's), as psutil processes.

    The user is the hub user this server runs for (``JUPYTERHUB_USER``, which its kernels and
    their tasks inherit: a hub whose spawner runs every student as one Unix user tells them apart
    so), else the Unix user.  A shared process (``processes=``) holds several tasks: it is listed
    once per task (its ``TFMAGIC_CHANNELS`` says how many), so that counts and limits are in tasks.
    """
    import psutil

    uid = os.getuid()
    hub_user = os.environ.get("JUPYTERHUB_USER")
    found = []
    for proc in psutil.process_iter(["cmdline", "uids"]):
        try:
            cmd = proc.info.get("cmdline") or []
            uids = proc.info.get("uids")
            if uids is None or uids.real != uid or not any(m in cmd for m in TASK_MODULES):
                continue
            env = proc.environ()
            if hub_user is not None and env.get("JUPYTERHUB_USER") != hub_user:
                continue
            channels = env.get("TFMAGIC_CHANNELS", "")
            found += [proc] * max(1, len([c for c in channels.split(",") if c]))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _pss(procs: list) -> int:
    import psutil

    total, seen = 0, set()
    for proc in procs:
        if proc.pid in seen:
            continue
        seen.add(proc.pid)
        try:
            total += int(getattr(proc.memory_full_info(), "pss", 0) or proc.memory_info().rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return total


def check_quota(new_tasks: int, new_bytes: int) -> None:
    """Raise :class:`WillNotFit` when ``new_tasks`` more tasks (about ``new_bytes``) go over a limit."""
    max_tasks, max_bytes = limits()
    if max_tasks is None and max_bytes is None:
        return
    who = os.environ.get(ENV_SET_BY) or "your hub's admin"
    running = user_tasks()
    if max_tasks is not None and len(running) + new_tasks > max_tasks:
        raise WillNotFit(
            f"{new_tasks} more tasks would make {len(running) + new_tasks}, over the {max_tasks} tasks you may "
            f"run here ({ENV_TASKS}, set by {who}); you run {len(running)} already: stop a cluster "
            "(%tf_cluster stop) or start fewer"
        )
    if max_bytes is not None:
        used = _pss(running)
        if used + new_bytes > max_bytes:
            raise WillNotFit(
                f"{new_tasks} more tasks need about {human_bytes(new_bytes)} and your tasks hold "
                f"{human_bytes(used)} already: over the {human_bytes(max_bytes)} you may use here ({ENV_MEMORY}, "
                f"set by {who}); stop a cluster (%tf_cluster stop) or start fewer"
            )


def usage() -> dict:
    """This user's tasks and their memory against the limits (for status and a teacher's view)."""
    max_tasks, max_bytes = limits()
    running = user_tasks()
    return {"tasks": len(running), "max_tasks": max_tasks, "pss": _pss(running), "max_memory": max_bytes}
