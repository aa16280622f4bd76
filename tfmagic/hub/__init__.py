"""tfmagic on a JupyterHub: what a hub's admin puts in ``jupyterhub_config.py``.

So far, the limits on each user's tfmagic (the teacher's class view is not built yet)::

    import tfmagic.hub
    tfmagic.hub.limits(c, max_tasks=6, max_memory="3 GB")

puts ``TFMAGIC_MAX_TASKS``, ``TFMAGIC_MAX_MEMORY`` and ``TFMAGIC_LIMITS_SET_BY`` in every single-user
server's environment (``c.Spawner.environment``), where :mod:`tfmagic.procs.quota` reads them: a
start or ``add`` that would take a user past either, counting every kernel of theirs on the
machine, is refused in one line naming the limit and who set it, and nothing starts.  Warm spares
count as tasks and are not made beyond the limit.  Bad values are refused here, when the hub reads
its configuration, not later in a student's notebook.

This module imports nothing from JupyterHub: ``c`` is the configuration object the hub passes its
config file (any traitlets ``Config`` works).
"""

from __future__ import annotations

from ..errors import BadArgument
from ..procs import quota


def limits(
    c, *, max_tasks: int | None = None, max_memory: str | int | None = None, set_by: str | None = None
) -> dict:
    """Limit every user's tfmagic tasks and their memory on this hub; returns the variables set."""
    env: dict[str, str] = {}
    if max_tasks is not None:
        if isinstance(max_tasks, bool) or not isinstance(max_tasks, int):
            raise BadArgument(f"max_tasks={max_tasks!r}: give a whole number of task processes, 1 or more")
        env[quota.ENV_TASKS] = str(max_tasks)
    if max_memory is not None:
        env[quota.ENV_MEMORY] = str(max_memory)
    if not env:
        raise BadArgument("tfmagic.hub.limits needs max_tasks=, max_memory= or both")
    env[quota.ENV_SET_BY] = set_by or "your hub's admin (jupyterhub_config.py)"
    _, memory = quota.limits(env)  # one line for a bad value, now
    if memory is not None:
        env[quota.ENV_MEMORY] = str(memory)  # bytes: the single-user side reads one form
    environment = c.Spawner.environment
    if not isinstance(environment, dict):  # an unset traitlets section reads as a lazy config
        environment = {}
    environment.update(env)
    c.Spawner.environment = environment
    return env
