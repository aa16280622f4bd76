"""A hub's limits on each user's tfmagic (issue 24, item 4): tasks and memory in all their kernels.

``tfmagic.hub.limits(c, ...)`` writes the limits into the single-user servers' environment; every
start and ``add`` counts this user's task processes on the machine (those of every kernel: a user is
the ``JUPYTERHUB_USER`` their server runs for, or the Unix user without a hub) and refuses in one
line, starting nothing, what would go over.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid

import pytest
from traitlets.config import Config

import tfmagic
import tfmagic.hub
from tfmagic.errors import BadArgument, WillNotFit
from tfmagic.procs import quota

from .conftest import poll_for


@pytest.mark.unit
def test_the_hub_config_puts_the_limits_in_every_servers_environment():
    c = Config()
    c.Spawner.environment = {"OTHER": "kept"}
    tfmagic.hub.limits(c, max_tasks=6, max_memory="3 GB")
    env = c.Spawner.environment
    assert env["OTHER"] == "kept" and env[quota.ENV_TASKS] == "6"
    assert quota.limits(env) == (6, 3 * 2**30)
    assert "admin" in env[quota.ENV_SET_BY]


@pytest.mark.unit
@pytest.mark.parametrize(
    "kwargs, says",
    [
        (dict(max_tasks=0), "TFMAGIC_MAX_TASKS='0' is not a number of tasks"),
        (dict(max_tasks="6"), "give a whole number of task processes"),
        (dict(max_memory="lots"), "TFMAGIC_MAX_MEMORY='lots' is not an amount of memory"),
        (dict(max_memory="auto"), "must be an amount of memory above 0"),
        (dict(), "needs max_tasks=, max_memory= or both"),
    ],
)
def test_a_malformed_limit_is_one_line_when_the_hub_reads_its_config(kwargs, says):
    with pytest.raises(BadArgument) as info:
        tfmagic.hub.limits(Config(), **kwargs)
    assert says in str(info.value) and "\n" not in str(info.value)


@pytest.fixture
def hub_user(monkeypatch):
    """This test as one hub user (tasks started now carry the name), with no limits yet."""
    name = f"student-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("JUPYTERHUB_USER", name)
    monkeypatch.delenv(quota.ENV_TASKS, raising=False)
    monkeypatch.delenv(quota.ENV_MEMORY, raising=False)
    monkeypatch.setenv(quota.ENV_SET_BY, "the test's admin")
    return name


@pytest.mark.cluster
def test_a_start_or_add_past_the_task_limit_is_refused_counting_every_kernel(hub_user, monkeypatch, no_leaks):
    monkeypatch.setenv(quota.ENV_TASKS, "3")
    first = tfmagic.LocalCluster(ps=1, workers=1, spares=False)
    first.start()
    try:
        assert len(quota.user_tasks()) == 2
        second = tfmagic.LocalCluster(ps=1, workers=1, spares=False)
        with pytest.raises(WillNotFit) as info:
            second.start()
        message = str(info.value)
        assert "2 more tasks would make 4, over the 3 tasks you may run here" in message, message
        assert "TFMAGIC_MAX_TASKS, set by the test's admin" in message and "\n" not in message
        assert not second.procs and len(quota.user_tasks()) == 2  # nothing started
        first.add("worker")  # 3: at the limit, allowed
        with pytest.raises(WillNotFit, match="1 more tasks would make 4"):
            first.add("worker")
        assert len(first.procs) == 3
        # another kernel of the same user: its start counts these three
        other = subprocess.run(
            [sys.executable, "-c", OTHER_KERNEL],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, quota.ENV_TASKS: "4"},
        )
        assert "refused: 2 more tasks would make 5, over the 4 tasks" in other.stdout, (
            other.stdout + other.stderr[-2000:]
        )
    finally:
        first.stop()
    poll_for(lambda: not quota.user_tasks(), 15, what="the user's tasks to end")


OTHER_KERNEL = textwrap.dedent(
    """
    import tfmagic
    from tfmagic.errors import WillNotFit
    try:
        tfmagic.LocalCluster(ps=1, workers=1, spares=False).start()
        print("started")
    except WillNotFit as exc:
        print("refused:", exc)
    """
)


@pytest.mark.cluster
def test_a_start_past_the_memory_limit_is_refused_and_another_users_tasks_do_not_count(
    hub_user, monkeypatch, local_cluster, no_leaks
):
    monkeypatch.setenv(quota.ENV_MEMORY, "300MB")  # less than two new tasks' estimate
    assert local_cluster.running and not quota.user_tasks()  # the session's tasks are another user's
    with pytest.raises(WillNotFit) as info:
        tfmagic.LocalCluster(ps=1, workers=1, spares=False).start()
    message = str(info.value)
    assert "2 more tasks need about 400 MB and your tasks hold 0 B already: over the 300 MB" in message, (
        message
    )
    monkeypatch.setenv(quota.ENV_MEMORY, "two")
    with pytest.raises(BadArgument, match="TFMAGIC_MAX_MEMORY='two' is not an amount of memory"):
        tfmagic.LocalCluster(ps=1, workers=1, spares=False).start()


@pytest.mark.cluster
def test_tasks_sharing_a_process_count_one_each(hub_user, monkeypatch, no_leaks):
    monkeypatch.setenv(quota.ENV_TASKS, "4")
    shared = tfmagic.LocalCluster(ps=1, workers=2, processes=1, spares=False)
    shared.start()
    try:
        assert len(quota.user_tasks()) == 3  # one process, three tasks
        assert quota.usage()["tasks"] == 3 and quota.usage()["max_tasks"] == 4
        with pytest.raises(WillNotFit, match="2 more tasks would make 5, over the 4 tasks"):
            tfmagic.LocalCluster(ps=1, workers=1, spares=False).start()
    finally:
        shared.stop()
