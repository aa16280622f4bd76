"""Shared fixtures: one real cluster per session, and a process-leak check.

TensorFlow processes cost ~5 s and ~0.35 GB each here, so tests share a
session-scoped cluster wherever they can; tests that must start their own
processes are checked afterwards for anything left behind.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import psutil
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Spares are tested on purpose where they matter; elsewhere they would only
# add background imports to every test's CPU load.
os.environ.setdefault("TFMAGIC_SPARES", "0")


#: The tiers, fastest first; every test carries at least one (``unit`` alone, or the kinds of real
#: process it starts). ``tests/README.md`` gives each tier's time budget.
TIERS = ("unit", "cluster", "kernel", "notebook", "browser", "soak", "server")


def pytest_collection_modifyitems(session, config, items):
    """Run the fast tier first, and refuse a test that names no tier.

    Unit tests move to the front (each tier keeps its order, so a module's shared fixtures stay
    together); when one of them fails, the run stops once the unit tier has finished
    (:func:`pytest_runtest_makereport`), so CI reports a broken contract within about two minutes
    instead of after the notebooks.
    """
    unmarked = [item.nodeid for item in items if not any(item.get_closest_marker(t) for t in TIERS)]
    if unmarked:
        raise pytest.UsageError(
            f"{len(unmarked)} test(s) carry no tier marker ({', '.join(TIERS)}), first {unmarked[0]}: "
            "mark each with the tier of what it starts"
        )
    unit = [item for item in items if _is_unit(item)]
    items[:] = unit + [item for item in items if not _is_unit(item)]
    config.stash[_LAST_UNIT] = unit[-1].nodeid if unit and len(unit) < len(items) else None
    config.stash[_UNIT_FAILED] = []


def _is_unit(item) -> bool:
    return item.get_closest_marker("unit") is not None and not any(
        item.get_closest_marker(t) for t in TIERS[1:]
    )


_LAST_UNIT = pytest.StashKey[object]()
_UNIT_FAILED = pytest.StashKey[list]()


def _cpu_seconds() -> float:
    """CPU this test process and the children it has reaped have used (kernels, launchers, tasks)."""
    import resource

    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


_CPU_AT_START: dict[str, float] = {}


def pytest_runtest_logstart(nodeid, location):
    _CPU_AT_START[nodeid] = _cpu_seconds()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.when == "teardown" and item.nodeid in _CPU_AT_START:
        # CI is CPU-bound on two cores: the JUnit XML carries each test's CPU beside its time
        # (tests/durations.py sums both). A process counts when it is reaped, so a shared
        # fixture's processes count in the test whose tear-down ended them.
        report.user_properties.append(("cpu_s", f"{_cpu_seconds() - _CPU_AT_START.pop(item.nodeid):.1f}"))
    failed = item.config.stash.get(_UNIT_FAILED, None)
    if failed is not None and report.failed and _is_unit(item):
        failed.append(item.nodeid)
    if call.when == "teardown" and item.nodeid == item.config.stash.get(_LAST_UNIT, None) and failed:
        item.session.shouldstop = (
            f"{len(failed)} unit test(s) failed (first {failed[0]}): the slower tiers were not run; "
            "fix the fast tier first"
        )
    return report


def poll_for(
    predicate: Callable[[], object],
    timeout: float = 30.0,
    interval: float = 0.05,
    what: str | Callable[[], str] = "condition",
):
    """Wait until ``predicate()`` is truthy and return it; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what() if callable(what) else what}"
            )
        time.sleep(interval)


#: Marks every process this test run starts (tasks inherit it through kernels
#: and launchers), so the leak check sees this run's tasks, also once orphaned
#: and re-parented, and never another run's on the same machine.
RUN_MARK = f"{os.getpid()}-{time.time_ns()}"
os.environ["TFMAGIC_TEST_RUN"] = RUN_MARK


def _ours(proc: psutil.Process) -> bool:
    try:
        if os.getpid() in {p.pid for p in proc.parents()}:
            return True
        return proc.environ().get("TFMAGIC_TEST_RUN") == RUN_MARK
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def task_processes() -> dict[int, str]:
    """This test run's tfmagic task processes: pid -> command line.

    A task is this run's if it descends from this process (local tasks,
    kernels' tasks, tasks under the tests' own sshd and Spark) or carries
    :data:`RUN_MARK` (an orphan whose parent died).
    """
    found = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if "tfmagic.task_main" in cmd and _ours(proc):
            found[proc.info["pid"]] = " ".join(cmd)
    return found


def assert_gone(pids, timeout: float = 15.0) -> None:
    """Every pid in ``pids`` ends within ``timeout`` (zombies count as gone)."""

    def all_gone():
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    return False
            except psutil.NoSuchProcess:
                pass
        return True

    poll_for(all_gone, timeout, what=f"processes {sorted(pids)} to end")


#: Callables returning pids that shared (module/session) fixtures own; the
#: leak check leaves those alone.
SHARED: list[Callable[[], set[int]]] = []


def share(cluster, pool=None) -> Callable[[], set[int]]:
    """Register a fixture's cluster (and spare pool) as shared; returns the handle to unregister."""

    def pids() -> set[int]:
        found = {p.pid for p in cluster.procs.values()}
        if pool is not None:
            found |= {p.pid for p in pool.processes()}
        return found

    SHARED.append(pids)
    return pids


@pytest.fixture(scope="session")
def local_cluster():
    """A 1 ps + 2 worker cluster shared by the whole session."""
    import tfmagic

    cluster = tfmagic.LocalCluster(ps=1, workers=2, name="session", spares=False)
    cluster.start()
    handle = share(cluster)
    yield cluster
    SHARED.remove(handle)
    pids = [p.pid for p in cluster.procs.values()]
    cluster.close()
    assert_gone(pids)


@pytest.fixture
def no_leaks(request):
    """Fail the test if it leaves task processes behind (besides shared fixtures)."""
    before = set(task_processes())
    yield
    from tfmagic import owner

    def shared() -> set[int]:
        return set().union(*(f() for f in SHARED)) if SHARED else set()

    def leftovers():
        keep = before | shared()
        return {pid: cmd for pid, cmd in task_processes().items() if pid not in keep}

    try:
        poll_for(lambda: not leftovers(), 15, what="task processes started by the test to end")
    except AssertionError:
        left = leftovers()
        for pid in left:  # clean up so one failure does not cascade
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
        raise AssertionError(f"test left task processes behind: {left}")
    # a spare being spawned is the owner's a moment before its pool lists it: look again
    poll_for(
        lambda: not [p for p in owner.processes() if p.pid not in shared() | before],
        15,
        what="every process this test started to end (or belong to a shared fixture)",
    )


def bytes_moved(before, after, src_job: str, dst_job: str) -> int:
    """Bytes sent from tasks of ``src_job`` to tasks of ``dst_job`` between two ``cluster.traffic()`` readings."""
    return sum(
        row["bytes"] - before.between(row["src"], row["dst"])
        for row in after
        if row["src"].startswith(src_job) and row["dst"].startswith(dst_job)
    )
