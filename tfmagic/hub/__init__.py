"""tfmagic on a JupyterHub: what a hub's admin puts in ``jupyterhub_config.py``.

The class page for teachers, and the limits on every user's tfmagic::

    import tfmagic.hub
    tfmagic.hub.configure(c, teachers="teachers", students="class-2026", experiment="stragglers")
    tfmagic.hub.limits(c, max_tasks=6, max_memory="3 GB")

:func:`configure` adds the hub-managed service ``python -m tfmagic.hub`` at
``/services/tfmagic/`` (:mod:`tfmagic.hub.service`), the custom scope ``custom:tfmagic:read``, and a
role that gives the members of the teachers' group that scope filtered to the class's group
(``custom:tfmagic:read!group=class-2026``) with what the page needs to list the class (its members
and their servers), and nothing else: no ``access:servers``, so no teacher reaches a student's
kernels or files through tfmagic.  Each student's tfmagic extension checks the scope on its class API
(:mod:`tfmagic.server.classapi`).

:func:`limits` puts ``TFMAGIC_MAX_TASKS``, ``TFMAGIC_MAX_MEMORY`` and ``TFMAGIC_LIMITS_SET_BY`` in every
single-user server's environment (``c.Spawner.environment``), where :mod:`tfmagic.procs.quota` reads
them: a start or ``add`` that would take a user past either, counting every kernel of theirs on the
machine, is refused in one line naming the limit and who set it, and nothing starts.  Warm spares
count as tasks and are not made beyond the limit.  Bad values are refused here, when the hub reads
its configuration, not later in a student's notebook.

This module imports nothing from JupyterHub: ``c`` is the configuration object the hub passes its
config file (any traitlets ``Config`` works).
"""

from __future__ import annotations

import re
import sys
from urllib.parse import urlparse

from ..errors import BadArgument
from ..experiments import names as experiment_names
from ..network.ports import free_port
from ..procs import quota

#: the scope a teacher's role holds, filtered to the class (checked by each student's server:
#: tfmagic.server.classapi holds the same name, the server and the hub being separate layers)
SCOPE = "custom:tfmagic:read"
#: what configure puts in the class page service's environment (read by tfmagic.hub.service)
ENV_TEACHERS = "TFMAGIC_HUB_TEACHERS"
ENV_STUDENTS = "TFMAGIC_HUB_STUDENTS"
ENV_EXPERIMENT = "TFMAGIC_HUB_EXPERIMENT"
ENV_PROXY = "TFMAGIC_HUB_PROXY"
#: ... and in every single-user server's (read by tfmagic.server.classapi): the service's name
ENV_SERVICE = "TFMAGIC_HUB_SERVICE"
_GROUP = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,254}$")


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


def _section(config, name: str):
    """``config.<name>`` as a plain value: None when unset (traitlets reads unset as a lazy value)."""
    value = config.get(name) if hasattr(config, "get") else getattr(config, name, None)
    return None if type(value).__name__ == "LazyConfigValue" else value


def configure(
    c,
    *,
    teachers: str,
    students: str,
    experiment: str | None = None,
    name: str = "tfmagic",
    port: int | None = None,
    hub_url: str | None = None,
) -> dict:
    """Add tfmagic's class page for ``teachers`` (a group) over ``students`` (a group); returns the service.

    ``experiment`` names the class experiment (one of ``%tf_experiment``'s), whose results the page
    gathers into one table.  ``port`` is the service's on loopback (a free one by default);
    ``hub_url`` is where the service reaches the students' servers through the hub's proxy (default:
    ``c.JupyterHub.bind_url``, so call this after setting it, else ``http://127.0.0.1:8000``).
    Groups that do not exist yet are the hub's to make (``c.JupyterHub.load_groups``); the page says
    so when it cannot list the class.
    """
    for label, group in (("teachers", teachers), ("students", students)):
        if not isinstance(group, str) or not _GROUP.match(group):
            raise BadArgument(
                f"{label}={group!r}: give the name of a JupyterHub group (letters, digits, _.@+-)"
            )
    if teachers == students:
        raise BadArgument(
            f"teachers and students are both {teachers!r}: the teachers' group must be another group"
        )
    if experiment is not None and experiment not in experiment_names():
        raise BadArgument(
            f"experiment={experiment!r}: not an experiment; choose one of {', '.join(experiment_names())}"
        )
    if not isinstance(name, str) or not re.match(r"^[a-z0-9][a-z0-9-]{0,62}$", name):
        raise BadArgument(f"name={name!r}: a service name is lower-case letters, digits and -")
    if hub_url is None:
        bind = _section(c.JupyterHub, "bind_url") or "http://127.0.0.1:8000"
        where = urlparse(bind)
        host = where.hostname if where.hostname not in (None, "", "0.0.0.0", "::") else "127.0.0.1"
        hub_url = f"{where.scheme or 'http'}://{host}:{where.port or 8000}"
    if not urlparse(hub_url).scheme.startswith("http"):
        raise BadArgument(f"hub_url={hub_url!r}: give the hub's address as http(s)://host:port")
    port = port or free_port()
    service = {
        "name": name,
        "url": f"http://127.0.0.1:{port}",
        "command": [sys.executable, "-m", "tfmagic.hub"],
        "environment": {
            ENV_TEACHERS: teachers,
            ENV_STUDENTS: students,
            ENV_EXPERIMENT: experiment or "",
            ENV_PROXY: hub_url,
        },
        # what a teacher's token for this page may carry: the read scope and the class's listing,
        # each cut down by the hub to what the teacher's own role grants (filtered to the class)
        "oauth_client_allowed_scopes": [SCOPE, "read:groups", "read:users:name", "read:servers"],
        # the hub's own read-only page: no "authorize access" form between a teacher and it
        "oauth_no_confirm": True,
    }
    services = list(_section(c.JupyterHub, "services") or [])
    services = [s for s in services if s.get("name") != name] + [service]
    c.JupyterHub.services = services
    scopes = dict(_section(c.JupyterHub, "custom_scopes") or {})
    scopes[SCOPE] = {
        "description": "Read a user's tfmagic clusters, experiments and limits (tfmagic's class page); "
        "no kernels, no files",
    }
    c.JupyterHub.custom_scopes = scopes
    role = {
        "name": f"{name}-teachers",
        "description": f"Teachers of {students}: tfmagic's class page, read-only",
        "groups": [teachers],
        "scopes": [
            f"{SCOPE}!group={students}",
            f"read:groups!group={students}",
            f"read:users:name!group={students}",
            f"read:servers!group={students}",
            f"access:services!service={name}",
        ],
    }
    # the service itself may read the two groups, only to say at its start when one is empty
    # (the hub makes a group a role names if it did not exist, with nobody in it)
    own = {
        "name": f"{name}-service",
        "description": "tfmagic's class page: checks its groups at start",
        "services": [name],
        "scopes": [f"read:groups!group={teachers}", f"read:groups!group={students}"],
    }
    names = {role["name"], own["name"]}
    roles = [r for r in (_section(c.JupyterHub, "load_roles") or []) if r.get("name") not in names]
    c.JupyterHub.load_roles = roles + [role, own]
    environment = c.Spawner.environment
    if not isinstance(environment, dict):
        environment = {}
    environment[ENV_SERVICE] = name
    c.Spawner.environment = environment
    return service
